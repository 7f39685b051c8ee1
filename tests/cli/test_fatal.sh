# A fatal error or a silent rank ends the whole job promptly, non-zero, with
# the error and the rank at fault named; nothing hangs.
source "$(dirname "$0")/lib.sh" "$@"
CONFIG="$SOURCE_DIR/configs/quickstart.toml"

start=$(date +%s)
timeout 60 "${LAUNCH[@]}" -n 4 train --config "$CONFIG" --dry-run \
  --set run.output_dir="$WORK/runs" --set faults.fail_rank=2 >out.txt 2>&1
status=$?
[ "$status" -ne 0 ] && [ "$status" -ne 124 ] || fail "fatal error: exit status $status"
expect_contains out.txt "fatal error on rank 2 (actor): injected failure" "fatal error message"
[ $(( $(date +%s) - start )) -lt 30 ] || fail "fatal error took more than 30 s to end the job"

start=$(date +%s)
timeout 60 "${LAUNCH[@]}" -n 4 train --config "$CONFIG" --dry-run \
  --set run.output_dir="$WORK/runs" --set faults.hang_rank=3 --set cluster.message_timeout_s=2 >out.txt 2>&1
status=$?
[ "$status" -ne 0 ] && [ "$status" -ne 124 ] || fail "hung rank: exit status $status"
expect_contains out.txt "rank 3 (env_worker 0) did not check in with learner 0 within 2 s" "stall report names the silent rank"
[ $(( $(date +%s) - start )) -lt 30 ] || fail "hung rank took more than 30 s to end the job"
finish
