# mpirun -np 4 moerl train --dry-run: exit 0, the plan names every rank's
# role, and learner 0 wrote a metrics line with all four ranks in it.
source "$(dirname "$0")/lib.sh" "$@"

"${LAUNCH[@]}" -n 4 train --config "$SOURCE_DIR/configs/quickstart.toml" --dry-run \
  --set run.output_dir="$WORK/runs" >out.txt 2>err.txt
expect_status 0 $? "dry run"
expect_contains out.txt "4 ranks on 1 host" "plan header"
for line in "learner 0" "actor 0" "actor 1" "env_worker 0"; do expect_contains out.txt "$line" "plan rows"; done
expect_count out.txt "moerl dry run" 1 "the plan is printed once"
expect_contains out.txt "12 round trips" "every ordered pair pinged"
python3 - "$WORK/runs/quickstart/metrics.jsonl" <<'PY' || fail "metrics.jsonl content"
import json, sys
lines = open(sys.argv[1]).read().splitlines()
assert len(lines) == 1, lines
record = json.loads(lines[0])
assert record["step"] == 0
assert sorted(r["rank"] for r in record["ranks"]) == [0, 1, 2, 3], record["ranks"]
assert record["roles"]["actor"]["ranks"] == 2
assert record["roles"]["actor"]["histograms"]["runtime.ping_round_trip_s"]["count"] == 6
PY
# Per-rank log files, every line tagged with rank and role.
"${LAUNCH[@]}" -n 4 train --config "$SOURCE_DIR/configs/quickstart.toml" --dry-run \
  --set run.output_dir="$WORK/runs2" --set telemetry.per_rank_log_files=true --log-level debug >out.txt 2>&1
expect_status 0 $? "dry run with per-rank logs"
for rank in 0 1 2 3; do
  [ -s "$WORK/runs2/quickstart/logs/rank-$rank.log" ] || fail "rank $rank log file missing or empty"
done
expect_contains "$WORK/runs2/quickstart/logs/rank-3.log" "[rank 3 env_worker 0]" "rank/role tag in the log"
finish
