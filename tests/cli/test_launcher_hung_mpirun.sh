# scripts/launch.sh when mpirun stays up after every rank has ended (Open MPI
# 5.0.11 under load): it ends mpirun and takes the job's status from what the
# ranks recorded (runtime/exit_record.h). A stand-in mpirun starts real moerl
# processes, waits for them and then never exits. Ranks that all stop on a
# configuration error keep status 2 (no restart); a rank killed by a signal
# records nothing, and the attempt counts as a lost rank (status 4).
source "$(dirname "$0")/lib.sh" "$@"
cat >fake_mpirun.sh <<'FAKE'
#!/usr/bin/env bash
[ "$1" = "--version" ] && { echo "stand-in mpirun"; exit 0; }
np=$2
shift 2
while [ "${1#--}" != "$1" ]; do shift; done  # the launcher's own flags
for ((rank = 0; rank < np; rank++)); do
  if [ "$rank" = "${FAKE_KILLED_RANK:--1}" ]; then
    bash -c 'kill -9 $$' &
  else
    "$@" &
  fi
done
wait
echo "stand-in mpirun: every rank ended; hanging" >&2
exec sleep 600
FAKE
chmod +x fake_mpirun.sh
export MOERL_MPIEXEC="$WORK/fake_mpirun.sh" MOERL_LAUNCHER_ORPHAN_GRACE_S=2
echo "[run]" >bad.toml
echo "nonsense_key = 1" >>bad.toml
LAUNCHED=(env MOERL_BIN="$MOERL" "$SOURCE_DIR/scripts/launch.sh")

# 1. Every rank ends on a configuration error: status 2, and no restart.
run_job config_error 120 "${LAUNCHED[@]}" --max-restarts 2 -n 2 train --config bad.toml
expect_status 2 $? "ranks that recorded status 2"
expect_contains config_error.txt "nonsense_key" "the ranks' own error"
expect_contains config_error.txt "still running 2 s after its last rank ended" "the launcher ends the hung mpirun"
expect_contains config_error.txt "the ranks' recorded exit status: 2" "the status comes from the records"
grep -q "restart 1 of" config_error.txt && fail "a configuration error was restarted"

# 2. One rank killed by a signal: no record from it, a lost rank (status 4).
run_job killed 120 env FAKE_KILLED_RANK=1 "${LAUNCHED[@]}" --max-restarts 0 -n 2 train --config bad.toml
expect_status 4 $? "a rank without a record"
expect_contains killed.txt "the ranks' recorded exit status: 4" "a missing record counts as a lost rank"

# 3. Nothing is left behind in the temporary directory.
ls "${TMPDIR:-/tmp}"/moerl-exit.* >/dev/null 2>&1 && [ -n "$(find "${TMPDIR:-/tmp}" -maxdepth 1 -name 'moerl-exit.*' -newer bad.toml)" ] &&
  fail "the launcher left its exit-status directories: $(find "${TMPDIR:-/tmp}" -maxdepth 1 -name 'moerl-exit.*' -newer bad.toml)"
finish
