# A real Prometheus server (Debian's `prometheus`, which scripts/setup.sh
# installs) scrapes learner 0's /metrics endpoint while a short training job
# runs; afterwards its HTTP query API must show that the key series exist and
# move: the step goes up, every MoE layer's expert load sums to 1, actors
# report weight versions, heartbeat ages are fresh, environment step
# latencies give a P99. `promtool check metrics` must accept a page fetched
# during the run. The server is started and stopped here; when it cannot
# start, the test fails and says why.
source "$(dirname "$0")/lib.sh" "$@"
command -v prometheus >/dev/null || { fail "prometheus is not installed (scripts/setup.sh installs Debian's)"; finish; }
command -v promtool >/dev/null || { fail "promtool is not installed (Debian's prometheus package has it)"; finish; }

METRICS_PORT=$(free_port)
PROM_PORT=$(free_port)
PROM="http://127.0.0.1:$PROM_PORT"

cat >prometheus.yml <<EOF
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: moerl
    static_configs:
      - targets: ["127.0.0.1:$METRICS_PORT"]
EOF
prometheus --config.file=prometheus.yml --storage.tsdb.path="$WORK/tsdb" --web.listen-address="127.0.0.1:$PROM_PORT" \
  >prometheus.log 2>&1 &
prom_pid=$!
trap 'kill $prom_pid 2>/dev/null; wait $prom_pid 2>/dev/null; rm -rf "$WORK"' EXIT
ready=0
for _ in $(seq 1 150); do
  curl -sf "$PROM/-/ready" >/dev/null 2>&1 && { ready=1; break; }
  kill -0 $prom_pid 2>/dev/null || break
  sleep 0.2
done
if [ $ready = 0 ]; then
  fail "the Prometheus server did not become ready within 30 s; its log:"
  sed 's/^/    | /' prometheus.log
  finish
fi

pretrain_tiny
STEPS=150
"${LAUNCH[@]}" -n 4 train --config "$CONFIG" "${TINY[@]}" --set run.name=scrape --set optim.total_steps=$STEPS \
  --set env.shaping=shaped --set checkpoint.every_steps=10 --set telemetry.prometheus_port="$METRICS_PORT" --init "$TINY_BASE" >scrape.txt 2>&1 &
job=$!
# A page fetched mid-run, for promtool's lint: tried from step 20 on until one
# answer arrives while the job runs (a single try raced the end of the job on a
# fast machine, where 60 tiny steps take a few seconds).
page_ok=0
if wait_for_line scrape.txt "step 20/$STEPS " 120; then
  while kill -0 $job 2>/dev/null; do
    curl -sf --max-time 5 "http://127.0.0.1:$METRICS_PORT/metrics" >page.txt && grep -q '^moerl_learner_step' page.txt \
      && { page_ok=1; break; }
    sleep 0.1
  done
fi
wait_job $job 240 "training job"
expect_status 0 $? "training job"
expect_contains scrape.txt "metrics: Prometheus can scrape http://127.0.0.1:$METRICS_PORT/metrics" "the endpoint is announced"
[ $page_ok = 1 ] || fail "no /metrics page could be fetched while the job ran (from step 20 on)"
if [ $page_ok = 1 ]; then
  promtool check metrics <page.txt >promtool.txt 2>&1 || { fail "promtool check metrics rejects the page"; sed 's/^/    | /' promtool.txt | head -40; }
fi
# The last scrapes land within a second of the job's end.
sleep 2

query() {  # query PROMQL: the API's JSON answer, evaluated now, into query.json
  curl -sf --max-time 10 -G "$PROM/api/v1/query" --data-urlencode "query=$1" >query.json || echo '{}' >query.json
}
check_query() {  # check_query WHAT PROMQL PYTHON: asserts on r (the result list) of the instant query
  query "$2"
  python3 - "$1" "$2" <<PY || fail "$1"
import json, sys
what, promql = sys.argv[1], sys.argv[2]
answer = json.load(open("query.json"))
r = answer.get("data", {}).get("result", [])
values = [float(x["value"][1]) for x in r]
try:
    $3
except AssertionError as e:
    print(f"{what}: {promql} -> {r} ({e})")
    raise
PY
}
W=10m  # the whole run
check_query "the step went up" "max_over_time(moerl_learner_step[$W]) - min_over_time(moerl_learner_step[$W])" \
  'assert len(values) == 1 and values[0] >= 10, values'
check_query "the last scraped step is near the end" "max_over_time(moerl_learner_step[$W])" \
  'assert values and values[0] >= '"$((STEPS - 20))"', values'
# The expert load of the learner's training batches and of each actor's decoding.
check_query "expert load sums to 1 per layer and rank" \
  "sum by (rank, layer) (last_over_time(moerl_moe_expert_load_ratio[$W]))" \
  'assert len(values) == 3 and all(abs(v - 1) < 1e-6 for v in values), values'
check_query "an imbalance per layer" "last_over_time(moerl_moe_expert_imbalance_ratio[$W])" \
  'assert values and all(v >= 1 for v in values), values'
check_query "both actors report weight versions that moved" "max_over_time(moerl_actor_weight_version[$W])" \
  'assert len(values) == 2 and all(v >= 10 for v in values), values'
check_query "heartbeat ages of the 3 other ranks were fresh" "max_over_time(moerl_rank_heartbeat_age_seconds[$W])" \
  'assert len(values) == 3 and all(0 <= v < 10 for v in values), values'
check_query "environment step P99 per family" \
  "histogram_quantile(0.99, sum by (family, le) (max_over_time(moerl_env_step_latency_seconds_bucket[$W])))" \
  'assert len(values) == 3 and all(0 < v < 10 for v in values), values'
check_query "generated tokens counted" "max_over_time(moerl_learner_generated_tokens_total[$W])" \
  'assert values and values[0] > 0, values'
check_query "training reward per family" "count(last_over_time(moerl_train_reward[$W]))" \
  'assert values and values[0] >= 1, values'
check_query "the base's held-out evaluation" "count(last_over_time(moerl_eval_success_ratio{bound=\"mean\"}[$W]))" \
  'assert values and values[0] >= 3, values'
check_query "resident memory of every rank" "count(last_over_time(moerl_process_resident_bytes[$W]) > 1e6)" \
  'assert values and values[0] == 4, values'
check_query "checkpoints saved" "max_over_time(moerl_checkpoint_last_version[$W])" \
  'assert values and values[0] >= 10, values'
check_query "weight publications timed" "max_over_time(moerl_sync_publication_seconds_count[$W])" \
  'assert values and values[0] >= 5, values'
finish
