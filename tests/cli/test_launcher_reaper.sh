# scripts/slurm/common.sh's moerl_reap_lingering_launcher, with stand-in
# processes: learner 0 (its record in <run>/ranks/rank-0.json, as moerl
# writes it) ends; a launcher that lingers past MOERL_LAUNCHER_GRACE_S is
# SIGKILLed and named, one that ends within it is left alone, and a record
# of another program (an earlier attempt's reused pid) is not taken for
# learner 0.
source "$(dirname "$0")/lib.sh" "$@"
sed -n '/^moerl_learner0_pid() {/,/^}/p; /^moerl_reap_lingering_launcher() {/,/^}/p' \
  "$SOURCE_DIR/scripts/slurm/common.sh" >functions.sh
grep -q "^moerl_reap_lingering_launcher() {" functions.sh || { fail "no moerl_reap_lingering_launcher in common.sh"; finish; }
source functions.sh
mkdir -p run/ranks
export MOERL_RUN_DIR="$WORK/run" MOERL_BIN=/usr/bin/sleep MOERL_LAUNCHER_GRACE_S=3
record() { echo "{\"pid\": $1, \"host\": \"$(hostname)\"}" >run/ranks/rank-0.json; }

# 1. The launcher lingers: killed about GRACE s after learner 0 ended.
sleep 2 & learner0=$!
sleep 600 & launcher=$!
record "$learner0"
started=$SECONDS
moerl_reap_lingering_launcher "$launcher" 2>reaped.txt
took=$((SECONDS - started))
wait "$launcher"
expect_status 137 $? "the lingering launcher was SIGKILLed"
[ "$took" -ge 4 ] && [ "$took" -le 12 ] || fail "the reaper acted after $took s (learner 0 2 s + grace 3 s)"
expect_contains reaped.txt "learner 0 (pid $learner0) has ended but the launcher (pid $launcher) has not, 3 s later; killing it" \
  "the kill is said"

# 2. The launcher ends 1 s after learner 0: left alone.
sleep 1 & learner0=$!
sleep 2 & launcher=$!
record "$learner0"
moerl_reap_lingering_launcher "$launcher" 2>quiet.txt
wait "$launcher"
expect_status 0 $? "a launcher that ends in time keeps its own status"
[ -s quiet.txt ] && fail "the reaper spoke about a launcher that ended in time: $(cat quiet.txt)"

# 3. The record names a live process of another program: no learner 0 of
#    this attempt, so nothing is killed (the reaper returns when the launcher ends).
bash -c 'sleep 5' & other=$!
sleep 3 & launcher=$!
record "$other"
MOERL_BIN="$(readlink -f "$MOERL")" moerl_reap_lingering_launcher "$launcher" 2>other.txt
wait "$launcher"
expect_status 0 $? "no learner 0 of this attempt: the launcher ends by itself"
[ -s other.txt ] && fail "the reaper acted on another program's pid: $(cat other.txt)"
kill "$other" 2>/dev/null
finish
