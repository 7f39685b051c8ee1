# scripts/launch.sh ends an mpirun that stays up after its ranks have ended.
# Seen with Open MPI 5.0.11: after an MPI_Abort its main thread deadlocked on
# a mutex and never reaped a rank that had exited, which stayed a zombie
# child; the launcher must not count that zombie as a running rank. A stand-in
# mpirun reproduces it: one "rank" runs for 2 s and is never reaped, and the
# stand-in itself never exits.
source "$(dirname "$0")/lib.sh" "$@"

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
# 2 s of the rank, 15 s of grace, a second or two of polling.
[ "$lasted" -le 40 ] || fail "ending the hung mpirun took $lasted s"
pgrep -f "$WORK/fake_mpirun" >/dev/null && fail "the stand-in mpirun is still running"
finish
