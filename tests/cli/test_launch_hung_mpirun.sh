# scripts/launch.sh ends an mpirun that stays up after its ranks have ended,
# and then takes the job's status from what the ranks recorded
# (runtime/exit_record.h).
source "$(dirname "$0")/lib.sh" "$@"

# 1. Seen with Open MPI 5.0.11: after an MPI_Abort its main thread deadlocked
# on a mutex and never reaped a rank that had exited, which stayed a zombie
# child; the launcher must not count that zombie as a running rank. A
# stand-in mpirun reproduces it: one "rank" runs for 2 s and is never reaped,
# and the stand-in itself never exits. That rank recorded no status (it is
# not moerl), so the attempt counts as a lost rank.
cat >fake_mpirun <<'SH'
#!/bin/bash
[ "${1:-}" = "--version" ] && { echo "stand-in mpirun"; exit 0; }
sleep 2 &
exec sleep 600
SH
chmod +x fake_mpirun

started=$SECONDS
run_job hung 90 env MOERL_MPIEXEC="$WORK/fake_mpirun" "${LAUNCH[@]}" -n 2 train --config "$CONFIG"
status=$?
lasted=$((SECONDS - started))
expect_status 4 "$status" "an mpirun left hanging after its last rank: a lost rank"
expect_contains hung.txt "still running 15 s after its last rank ended; stopping it" "the launcher says why"
expect_contains hung.txt "the ranks' recorded exit status: 4" "no record: a lost rank"
# 2 s of the rank, 15 s of grace, a second or two of polling.
[ "$lasted" -le 40 ] || fail "ending the hung mpirun took $lasted s"
pgrep -f "$WORK/fake_mpirun" >/dev/null && fail "the stand-in mpirun is still running"

# 2. Seen in CI (cli.placement): every rank stopped on a configuration error
# (status 2) and mpirun stayed up. The stand-in starts real moerl processes
# (each a world of one), waits for them and never exits. The ranks' records
# keep status 2, which launch.sh never restarts.
cat >fake_mpirun_ranks <<'SH'
#!/usr/bin/env bash
[ "$1" = "--version" ] && { echo "stand-in mpirun"; exit 0; }
np=$2
shift 2
while [ "${1#--}" != "$1" ]; do shift; done  # the launcher's own flags
for ((rank = 0; rank < np; rank++)); do "$@" & done
wait
exec sleep 600
SH
chmod +x fake_mpirun_ranks
printf '[run]\nnonsense_key = 1\n' >bad.toml
run_job config_error 120 env MOERL_MPIEXEC="$WORK/fake_mpirun_ranks" MOERL_LAUNCHER_ORPHAN_GRACE_S=2 \
  MOERL_BIN="$MOERL" "$SOURCE_DIR/scripts/launch.sh" --max-restarts 2 -n 2 train --config bad.toml
expect_status 2 $? "ranks that recorded status 2"
expect_contains config_error.txt "nonsense_key" "the ranks' own error"
expect_contains config_error.txt "still running 2 s after its last rank ended" "the launcher ends the hung mpirun"
expect_contains config_error.txt "the ranks' recorded exit status: 2" "the status comes from the records"
grep -q "restart 1 of" config_error.txt && fail "a configuration error was restarted"
finish
