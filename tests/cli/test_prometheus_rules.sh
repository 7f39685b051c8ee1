# The Prometheus alert rules, sample server config and Grafana dashboard
# (configs/prometheus/, configs/grafana/), checked offline with promtool:
# the rules and config are valid, the unit tests in alerts_test.yml pass, every
# alert has a case that fires and one that does not, every metric they use is
# one docs/observability.md lists, and the dashboard is valid JSON whose
# queries parse. Broken copies must fail, so that each check is shown able to.
# promtool comes with Debian's `prometheus` package (scripts/setup.sh); without
# it this test fails, it does not skip. moerl itself is not run.
# lib.sh works in a temporary directory: relative arguments are made absolute first.
moerl_arg=$(realpath -m -- "${1:?usage: test_prometheus_rules.sh MOERL_BINARY SOURCE_DIR}")
source_arg=$(realpath -- "${2:?usage: test_prometheus_rules.sh MOERL_BINARY SOURCE_DIR}")
source "$(dirname "$0")/lib.sh" "$moerl_arg" "$source_arg"
PROM="$SOURCE_DIR/configs/prometheus"
DASHBOARD="$SOURCE_DIR/configs/grafana/moerl-dashboard.json"
DOC="$SOURCE_DIR/docs/observability.md"
# The alerts the rules must define (docs/observability.md#alerts describes each).
ALERTS=(MoerlExpertImbalance MoerlHeartbeatLost MoerlRankLost MoerlActorBehind MoerlEnvStepP99High
        MoerlStalenessHigh MoerlDroppedGroupsHigh MoerlEvalRegressed MoerlCheckpointFailing
        MoerlCheckpointStale MoerlThroughputCollapse MoerlEndpointDown)

PROMTOOL=$(command -v promtool)
if [ -z "$PROMTOOL" ]; then
  fail "promtool is missing (Debian package prometheus: run scripts/setup.sh, or apt-get install prometheus)"
  finish
fi
command -v python3 >/dev/null || { fail "python3 is missing"; finish; }
show() { sed 's/^/    | /' "$1"; }

# The committed files, copied together (rule_files and the tests' rule_files
# are relative to the file that names them).
mkdir good && cp "$PROM/alerts.yml" "$PROM/alerts_test.yml" "$PROM/prometheus.yml" good/
"$PROMTOOL" check rules good/alerts.yml >check_rules.txt 2>&1 || { fail "promtool check rules alerts.yml"; show check_rules.txt; }
"$PROMTOOL" check config good/prometheus.yml >check_config.txt 2>&1 || { fail "promtool check config prometheus.yml"; show check_config.txt; }
expect_contains check_config.txt "1 rule files found" "prometheus.yml loads alerts.yml"
(cd good && "$PROMTOOL" test rules alerts_test.yml) >test_rules.txt 2>&1 ||
  { fail "promtool test rules alerts_test.yml"; show test_rules.txt; }

# The sample server: scrapes moerl's default port every 5 s and loads the rules.
grep -qE '^  scrape_interval: 5s$' good/prometheus.yml || fail "prometheus.yml: scrape_interval is not 5s"
grep -qE '^  - job_name: moerl$' good/prometheus.yml || fail "prometheus.yml: no job \"moerl\""
grep -qF '"localhost:9464"' good/prometheus.yml || fail "prometheus.yml: no target localhost:9464"

# Every alert in alerts.yml, with a firing and a non-firing case in alerts_test.yml.
# coverage_awk TESTS: "ALERT fires" / "ALERT quiet" per alert_rule_test entry,
# read line by line (exp_alerts: [] or none = quiet; a list or an alias = fires).
coverage_awk() {
  awk '
    function flush() { if (alert != "") print alert, (fires ? "fires" : "quiet"); alert = "" }
    /^ *- eval_time:/ || /^ *- (name|interval):/ || /^ *(input_series|promql_expr_test):/ { flush() }
    /^ *alertname:/ { alert = $2; fires = 0 }
    /^ *exp_alerts: *\*/ { fires = 1 }
    /^ *- exp_labels:/ { fires = 1 }
    END { flush() }' "$1" | sort -u
}
rule_names() { sed -n 's/^ *- alert: *\([A-Za-z0-9]*\) *$/\1/p' "$1" | sort -u; }
# check_coverage RULES TESTS: prints one "MISSING: ..." line per gap.
check_coverage() {
  local alert cases
  cases=$(coverage_awk "$2")
  for alert in "${ALERTS[@]}"; do
    grep -qxF "$alert" <(rule_names "$1") || echo "MISSING: alert $alert is not in alerts.yml"
  done
  for alert in $(rule_names "$1"); do
    grep -qxF "$alert fires" <<<"$cases" || echo "MISSING: $alert has no case where it fires"
    grep -qxF "$alert quiet" <<<"$cases" || echo "MISSING: $alert has no case where it does not fire"
  done
}
check_coverage good/alerts.yml good/alerts_test.yml >coverage.txt
[ -s coverage.txt ] && { fail "alert coverage (grep/awk)"; show coverage.txt; }
[ "$(rule_names good/alerts.yml | wc -l)" -eq "${#ALERTS[@]}" ] ||
  fail "alerts.yml has $(rule_names good/alerts.yml | wc -l) alerts, expected ${#ALERTS[@]}: $(rule_names good/alerts.yml | tr '\n' ' ')"

# With PyYAML, the same facts from the parsed files, and the rules' shape.
if python3 -c "import yaml" 2>/dev/null; then
  python3 - good/alerts.yml good/alerts_test.yml "$(coverage_awk good/alerts_test.yml)" >coverage_yaml.txt 2>&1 <<'PY' ||
import re, sys, yaml
rules_doc, tests_doc = yaml.safe_load(open(sys.argv[1])), yaml.safe_load(open(sys.argv[2]))
awk_cases = set(sys.argv[3].splitlines())
def bad(why): print("BAD:", why)
groups = rules_doc.get("groups", [])
if [g.get("name") for g in groups] != ["moerl"]:
    bad(f"rule groups {[g.get('name') for g in groups]}, expected one group 'moerl'")
alerts = []
for g in groups:
    for r in g.get("rules", []):
        name = r.get("alert")
        if name is None:
            continue
        alerts.append(name)
        if not re.fullmatch(r"Moerl(?:[A-Z][a-z0-9]*)+", name):
            bad(f"{name}: not CamelCase with the Moerl prefix")
        if "for" not in r:
            bad(f"{name}: no for:")
        if r.get("labels", {}).get("severity") not in ("warning", "critical"):
            bad(f"{name}: severity {r.get('labels', {}).get('severity')!r}, expected warning or critical")
        for key in ("summary", "description"):
            if not r.get("annotations", {}).get(key):
                bad(f"{name}: no {key} annotation")
        # The annotations name what the alert is about from its labels.
        if "$labels." not in r.get("annotations", {}).get("summary", ""):
            bad(f"{name}: the summary names no label ($labels.rank/family/layer/instance)")
cases = set()
for t in tests_doc.get("tests", []):
    for a in t.get("alert_rule_test", []) or []:
        cases.add(f"{a['alertname']} {'fires' if a.get('exp_alerts') else 'quiet'}")
        if a["alertname"] not in alerts:
            bad(f"alerts_test.yml tests {a['alertname']}, which alerts.yml does not define")
for name in alerts:
    for state in ("fires", "quiet"):
        if f"{name} {state}" not in cases:
            bad(f"{name}: no case where it {'fires' if state == 'fires' else 'does not fire'}")
if cases != awk_cases:
    bad(f"the grep/awk reading of alerts_test.yml differs from PyYAML's: {sorted(cases ^ awk_cases)}")
print(f"CHECKED: {len(alerts)} alerts, {len(cases)} kinds of case")
PY
    { fail "alerts.yml / alerts_test.yml checker crashed"; show coverage_yaml.txt; }
  if grep -q '^BAD' coverage_yaml.txt || ! grep -q '^CHECKED' coverage_yaml.txt; then
    fail "alert rules / coverage (PyYAML)"; show coverage_yaml.txt
  fi
else
  echo "python3-yaml is missing: coverage read with grep/awk only"
fi

# Every metric the rules and the dashboard use is one docs/observability.md's
# table lists (histograms: with _bucket/_sum/_count).
sed -n 's/^| `\(moerl_[a-z0-9_]*\)` | \([a-z]*\) |.*/\1 \2/p' "$DOC" >documented.txt
[ "$(wc -l <documented.txt)" -ge 20 ] || { fail "docs/observability.md: its table of series was not found"; show documented.txt; }
# unknown_metrics FILE...: the moerl_ names in FILE that the table lacks.
unknown_metrics() {
  local name base
  for name in $(grep -ohE 'moerl_[a-z0-9_]+' "$@" | sort -u); do
    grep -q "^$name " documented.txt && continue
    base=${name%_bucket}; base=${base%_sum}; base=${base%_count}
    [ "$base" != "$name" ] && grep -q "^$base histogram$" documented.txt && continue
    echo "$name"
  done
}
python3 - "$DASHBOARD" >dashboard_exprs.txt 2>dashboard_json.txt <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
def walk(x):
    if isinstance(x, dict):
        for k, v in x.items():
            if k in ("expr", "definition") and isinstance(v, str):
                print(v)
            else:
                walk(v)
    elif isinstance(x, list):
        for v in x:
            walk(v)
walk(d)
PY
[ $? -eq 0 ] || { fail "the dashboard is not valid JSON"; show dashboard_json.txt; }
unknown=$(unknown_metrics good/alerts.yml)
[ -z "$unknown" ] || fail "alerts.yml uses metrics docs/observability.md does not list: $(echo $unknown)"
unknown=$(unknown_metrics dashboard_exprs.txt)
[ -z "$unknown" ] || fail "the dashboard queries metrics docs/observability.md does not list: $(echo $unknown)"
# A made-up name is caught.
sed 's/moerl_rank_heartbeat_age_seconds > 30/moerl_rank_heartbeat_seconds > 30/' good/alerts.yml >unknown_metric.yml
unknown_metrics unknown_metric.yml | grep -qx moerl_rank_heartbeat_seconds || fail "an undocumented metric is not caught"

# The dashboard: Grafana's schema 36+, a Prometheus datasource variable every
# panel uses, the panels asked for, and queries that parse as PromQL (as
# recording rules, with Grafana's variables filled in).
python3 - "$DASHBOARD" >dashboard.txt 2>&1 <<'PY' || { fail "dashboard checker crashed"; show dashboard.txt; }
import json, sys
d = json.load(open(sys.argv[1]))
def bad(why): print("BAD:", why)
if not isinstance(d.get("schemaVersion"), int) or d["schemaVersion"] < 36:
    bad(f"schemaVersion {d.get('schemaVersion')!r} < 36")
variables = {v.get("name"): v for v in d.get("templating", {}).get("list", [])}
ds = [n for n, v in variables.items() if v.get("type") == "datasource" and v.get("query") == "prometheus"]
if not ds:
    bad("no Prometheus datasource variable")
panels = [p for p in d.get("panels", []) if p.get("type") != "row"]
ids = [p.get("id") for p in d.get("panels", [])]
if len(ids) != len(set(ids)):
    bad("panel ids repeat")
exprs = []
for p in panels:
    uid = p.get("datasource", {}).get("uid", "")
    if ds and uid != "${" + ds[0] + "}":
        bad(f"panel {p.get('title')!r}: datasource {uid!r}, not the variable")
    if not p.get("targets"):
        bad(f"panel {p.get('title')!r}: no queries")
    for t in p.get("targets", []):
        if not t.get("expr"):
            bad(f"panel {p.get('title')!r}: a query without expr")
        exprs.append(t.get("expr", ""))
text = "\n".join(exprs)
for metric in ("moerl_learner_step", "moerl_learner_weight_version", "moerl_actor_weight_version",
               "moerl_train_reward", "moerl_train_success_ratio", 'bound="ci_low"', 'bound="ci_high"',
               "rate(moerl_learner_generated_tokens_total", "histogram_quantile(0.5, sum by (family, le) (rate(moerl_env_step_latency_seconds_bucket",
               "histogram_quantile(0.99, sum by (family, le) (rate(moerl_env_step_latency_seconds_bucket",
               "moerl_moe_expert_load_ratio", "moerl_moe_expert_imbalance_ratio", "moerl_rank_heartbeat_age_seconds",
               "histogram_quantile(0.9, rate(moerl_learner_staleness_versions_bucket", "moerl_sync_publication_seconds",
               "moerl_process_resident_bytes", "moerl_checkpoint_last_version"):
    if metric not in text:
        bad(f"no panel queries {metric}")
with open("dashboard_rules.yml", "w") as f:
    f.write("groups:\n  - name: dashboard\n    rules:\n")
    for i, e in enumerate(exprs):
        for var, value in (("$__rate_interval", "1m"), ("$instance", ".*"), ("$layer", ".*")):
            e = e.replace(var, value)
        f.write(f"      - record: dashboard:query{i}\n        expr: {json.dumps(e)}\n")
print(f"CHECKED: {len(panels)} panels, {len(exprs)} queries")
PY
if grep -q '^BAD' dashboard.txt || ! grep -q '^CHECKED' dashboard.txt; then fail "the dashboard"; show dashboard.txt; fi
if [ -f dashboard_rules.yml ]; then
  "$PROMTOOL" check rules dashboard_rules.yml >dashboard_promql.txt 2>&1 ||
    { fail "a dashboard query is not valid PromQL"; show dashboard_promql.txt; }
fi

# --- The checks can fail ---------------------------------------------------
# A broken rules file and config are rejected.
mkdir broken_syntax && cp good/* broken_syntax/
sed -i 's/expr: moerl_moe_expert_imbalance_ratio > 2$/expr: moerl_moe_expert_imbalance_ratio > > 2/' broken_syntax/alerts.yml
"$PROMTOOL" check rules broken_syntax/alerts.yml >broken_syntax.txt 2>&1 && fail "promtool check rules accepts a rule that does not parse"
"$PROMTOOL" check config broken_syntax/prometheus.yml >broken_config.txt 2>&1 && fail "promtool check config accepts a config whose rules do not parse"

# section NAME DIR: the header of DIR/alerts_test.yml and the tests of alert
# NAME only (the "# --- NAME ---" section), as DIR/NAME_test.yml.
section() {
  awk -v a="$1" '/^  # --- Moerl/ { keep = ($3 == a) } /^tests:/ { print; head = 1; next } !head || keep' \
    "$2/alerts_test.yml" >"$2/$1_test.yml"
  grep -q "alertname: $1\$" "$2/$1_test.yml" || fail "alerts_test.yml has no \"# --- $1 ---\" section"
}
# must_fail NAME ALERT SED [rules|tests]: alerts.yml (or alerts_test.yml) edited by
# SED must make the tests of ALERT fail, naming ALERT.
must_fail() {
  local name=$1 alert=$2 edit=$3 file=${4:-rules}
  local target="$name/alerts.yml"
  [ "$file" = tests ] && target="$name/alerts_test.yml"
  mkdir "$name" && cp good/* "$name/"
  sed -i -e "$edit" "$target"
  if cmp -s "$target" "good/$(basename "$target")"; then fail "$name: the edit '$edit' changed nothing"; return; fi
  section "$alert" "$name"
  if (cd "$name" && "$PROMTOOL" test rules "${alert}_test.yml") >"$name.txt" 2>&1; then
    fail "$name: promtool test rules passes with the edit '$edit'"
  elif ! grep -q "alertname: $alert" "$name.txt"; then
    fail "$name: promtool test rules fails, but not on $alert"; show "$name.txt"
  fi
}
# An altered expectation (the heartbeat age in the annotation, a severity).
must_fail wrong_annotation MoerlHeartbeatLost 's/no heartbeat for 185 s/no heartbeat for 186 s/' tests
must_fail wrong_severity MoerlActorBehind '/alertname: MoerlActorBehind/,/exp_annotations/ s/severity: warning/severity: critical/' tests
# Each near miss is near: a slightly looser rule fires on it.
must_fail looser_imbalance MoerlExpertImbalance 's/imbalance_ratio > 2$/imbalance_ratio > 1.85/'
must_fail shorter_imbalance_for MoerlExpertImbalance '/alert: MoerlExpertImbalance/,/for:/ s/for: 10m/for: 8m/'
must_fail looser_heartbeat MoerlHeartbeatLost 's/heartbeat_age_seconds > 30$/heartbeat_age_seconds > 20/'
must_fail looser_rank_lost MoerlRankLost 's/lost_ranks_total\[10m\]) > 0$/lost_ranks_total[10m]) >= 0/'
must_fail no_new_counter_rank_lost MoerlRankLost '/^ *(moerl_coordinator_lost_ranks_total > 0 unless/d; /alert: MoerlRankLost/,/for:/ { /^ *or$/d }'
must_fail looser_actor MoerlActorBehind '/alert: MoerlActorBehind/,/for:/ s/^\( *\)> 2$/\1> 1/'
must_fail looser_env_p99 MoerlEnvStepP99High '/alert: MoerlEnvStepP99High/,/for:/ s/> 0.5$/> 0.35/'
must_fail looser_staleness MoerlStalenessHigh 's/staleness_versions_bucket\[10m\])) > 4$/staleness_versions_bucket[10m])) > 3.5/'
must_fail looser_dropped MoerlDroppedGroupsHigh 's/^\( *\)> 0.25$/\1> 0.15/'
must_fail no_resume_guard MoerlDroppedGroupsHigh '/unless on (job, instance) (max by (job, instance) (resets/d'
must_fail eval_mean MoerlEvalRegressed 's/moerl_eval_success_ratio{bound="ci_high"}/moerl_eval_success_ratio{bound="mean"}/'
must_fail longer_checkpoint_window MoerlCheckpointFailing 's/failures_total\[30m\]/failures_total[45m]/'
must_fail no_first_save_guard MoerlCheckpointStale '/and moerl_checkpoint_last_version offset 1h/d'
must_fail no_step_guard MoerlCheckpointStale 's/(changes(moerl_learner_step\[1h\])) > 0)/(changes(moerl_learner_step[1h])) >= 0)/'
must_fail looser_throughput MoerlThroughputCollapse 's/< 0.2 \* rate/< 0.35 * rate/'
# ... and a stricter one misses the firing case.
must_fail stricter_heartbeat MoerlHeartbeatLost '/alert: MoerlHeartbeatLost/,/for:/ s/for: 1m/for: 3m/'
must_fail stricter_throughput MoerlThroughputCollapse 's/< 0.2 \* rate/< 0.05 * rate/'
must_fail looser_endpoint MoerlEndpointDown 's/for: 2m/for: 0m/'

# A missing case and a missing alert are caught.
mkdir uncovered && cp good/* uncovered/
awk '/^  - name: a silent actor/ { skip = 1 } /^  - name: heartbeat near miss/ { skip = 0 } !skip' good/alerts_test.yml >uncovered/alerts_test.yml
check_coverage uncovered/alerts.yml uncovered/alerts_test.yml >uncovered.txt
grep -q "MISSING: MoerlHeartbeatLost has no case where it fires" uncovered.txt ||
  { fail "a missing firing case is not caught"; show uncovered.txt; }
sed '/- alert: MoerlEvalRegressed/s/MoerlEvalRegressed/MoerlEvalRegression/' good/alerts.yml >uncovered/alerts.yml
check_coverage uncovered/alerts.yml good/alerts_test.yml >renamed.txt
grep -q "MISSING: alert MoerlEvalRegressed is not in alerts.yml" renamed.txt &&
  grep -q "MISSING: MoerlEvalRegression has no case where it fires" renamed.txt ||
  { fail "a renamed alert is not caught"; show renamed.txt; }
# A dashboard that is not JSON.
sed '0,/"panels"/s/"panels"/panels/' "$DASHBOARD" >broken.json
python3 -m json.tool broken.json >/dev/null 2>&1 && fail "a dashboard that is not JSON passes"
finish
