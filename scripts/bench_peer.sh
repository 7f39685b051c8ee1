#!/usr/bin/env bash
# moerl against the tools a user would pick instead, on the same weights and
# threads: batched decode (moerl bench rollout vs transformers), one MoE
# layer's forward+backward (moerl bench moe vs transformers' Mixtral block) and
# one GRPO learner update on the same batch (moerl bench update vs a plain
# PyTorch update, benchmarks/peer/grpo_update.py).
# Rounds alternate the two sides (moerl, peer, moerl, peer, ...); the table
# gives each side's median and minimum over the rounds and the ratio of the
# medians (tokens/s: above 1 means moerl is faster). See docs/performance.md.
#
# Usage: scripts/bench_peer.sh [options]
#   --install            create or update the peer's virtual environment (.venv/,
#                        benchmarks/peer/requirements.txt: PyTorch, transformers;
#                        about 5.6 GB, a few minutes) and go on
#   --moerl-only         run moerl's side only (no virtual environment needed)
#   --tiny               a tiny model and sizes (seconds; what CI runs)
#   --rounds N           rounds of each side (default 3)
#   --threads "1 2"      thread counts (default "1 2")
#   --checkpoint DIR:V   the weights: version V of the checkpoint store DIR
#                        (default: a model of configs/quickstart.toml's shape
#                        after one training step, made here)
#   --out FILE           the table as JSON (default runs/bench_peer/table.json)
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"

install=0 moerl_only=0 tiny=0 rounds=3 threads="1 2" checkpoint="" out="runs/bench_peer/table.json"
while [ $# -gt 0 ]; do
  case "$1" in
    --install) install=1; shift ;;
    --moerl-only) moerl_only=1; shift ;;
    --tiny) tiny=1; shift ;;
    --rounds) rounds="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --checkpoint) checkpoint="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) echo "bench_peer: unknown option $1 (see the top of scripts/bench_peer.sh)" >&2; exit 2 ;;
  esac
done
case "$rounds" in ''|*[!0-9]*|0) echo "bench_peer: --rounds needs a positive number, got '$rounds'" >&2; exit 2 ;; esac
die() { echo "bench_peer: $*" >&2; exit 1; }

MOERL="${MOERL_BIN:-$ROOT/${MOERL_BUILD_DIR:-build}/moerl}"
[ -x "$MOERL" ] || die "no moerl binary at $MOERL (run scripts/build.sh)"
VENV="$ROOT/.venv"
REQUIREMENTS="$ROOT/benchmarks/peer/requirements.txt"
if [ "$install" = 1 ]; then
  if [ -x "$VENV/bin/python" ] && cmp -s "$REQUIREMENTS" "$VENV/requirements.txt"; then
    echo "bench_peer: the peer's virtual environment is up to date"
  else
    echo "bench_peer: installing $(grep -v '^#' "$REQUIREMENTS" | tr '\n' ' ')into .venv/"
    rm -rf "$VENV.partial"
    python3 -m venv "$VENV.partial" &&
      "$VENV.partial/bin/pip" install -q --disable-pip-version-check -r "$REQUIREMENTS" ||
      { rm -rf "$VENV.partial"; die "could not install the peer's requirements from PyPI"; }
    cp "$REQUIREMENTS" "$VENV.partial/requirements.txt"
    rm -rf "$VENV" && mv "$VENV.partial" "$VENV"
  fi
fi
if [ "$moerl_only" = 0 ]; then
  [ -x "$VENV/bin/python" ] || die "the peer side needs its virtual environment: run scripts/bench_peer.sh --install (or --moerl-only)"
  cmp -s "$REQUIREMENTS" "$VENV/requirements.txt" ||
    die ".venv/ was installed from other requirements than benchmarks/peer/requirements.txt: run scripts/bench_peer.sh --install"
fi

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
if [ "$tiny" = 1 ]; then
  SHAPE=(--set model.d_model=32 --set model.num_heads=2 --set model.num_kv_heads=1 --set model.num_layers=1
         --set moe.d_expert=32 --set model.d_ff=32 --set moe.num_experts=4 --set rollout.sessions_per_actor=8
         --set rollout.max_tokens_per_episode=128 --set algo.groups_per_step=2)
  SESSIONS=1,4 CONTEXTS=32 STEPS=4 MOE=(--quick)
else
  # model.d_ff as moe.d_expert: an export's config.json has one intermediate size (every layer is MoE).
  SHAPE=(--set model.d_ff=128) SESSIONS=1,4,16,64,256 CONTEXTS=64,512 STEPS=32 MOE=()
fi

# The weights both sides use. (moerl's side reads them through configs/quickstart.toml
# with SHAPE, which must agree with the export's config.json.)
if [ -z "$checkpoint" ]; then
  echo "bench_peer: making a model of configs/quickstart.toml's shape (one training step)"
  scripts/launch.sh -n 4 train --config configs/quickstart.toml "${SHAPE[@]}" --set run.output_dir="$WORK/runs" \
    --set run.name=peer --set optim.total_steps=1 --set checkpoint.every_steps=1 --set rollout.eval_episodes=0 \
    >"$WORK/train.txt" 2>&1 || { tail -n 20 "$WORK/train.txt" >&2; die "the training step that makes the model failed"; }
  checkpoint="$WORK/runs/peer/checkpoints:1"
fi
"$MOERL" checkpoint export-hf "${checkpoint%:*}" "${checkpoint##*:}" "$WORK/hf" >"$WORK/export.txt" 2>&1 ||
  { cat "$WORK/export.txt" >&2; die "moerl checkpoint export-hf of $checkpoint failed"; }
echo "bench_peer: $(tail -n 1 "$WORK/export.txt")"

run() {  # run LOG CMD...: CMD or the end of its log and a clear stop
  "${@:2}" >"$WORK/$1.log" 2>&1 || { tail -n 20 "$WORK/$1.log" >&2; die "$1 failed: ${*:2}"; }
}
PY="$VENV/bin/python"
export PYTHONWARNINGS=ignore TRANSFORMERS_VERBOSITY=error
for r in $(seq 1 "$rounds"); do
  for t in $threads; do
    echo "bench_peer: round $r of $rounds, decode at $t thread(s)"
    run "moerl-decode-r$r-t$t" env OMP_NUM_THREADS="$t" "$MOERL" bench rollout --threads "$t" --init "hf:$WORK/hf" "${SHAPE[@]}" \
      --sessions "$SESSIONS" --contexts "$CONTEXTS" --steps "$STEPS" --recompute 0 --out "$WORK/moerl-decode-r$r-t$t.json"
    [ "$moerl_only" = 1 ] ||
      run "peer-decode-r$r-t$t" sh -c "OMP_NUM_THREADS=$t '$PY' '$ROOT/benchmarks/peer/peer_decode.py' --model '$WORK/hf' \
        --sessions $SESSIONS --contexts $CONTEXTS --steps $STEPS --threads $t >'$WORK/peer-decode-r$r-t$t.json'"
    # One learner update on the same batch: moerl's writes it (a Learner runs in a
    # 3-rank job whose other ranks wait idle), the hand-written PyTorch one reads it.
    echo "bench_peer: round $r of $rounds, GRPO update at $t thread(s)"
    run "moerl-update-r$r-t$t" env OMP_NUM_THREADS="$t" MOERL_THREADS_PER_RANK="$t" scripts/launch.sh -n 3 bench update \
      "${MOE[@]}" --threads "$t" --init "hf:$WORK/hf" "${SHAPE[@]}" --write-batch "$WORK/batch.json" \
      --out "$WORK/moerl-update-r$r-t$t.json"
    [ "$moerl_only" = 1 ] && continue
    run "peer-update-r$r-t$t" sh -c "OMP_NUM_THREADS=$t '$PY' '$ROOT/benchmarks/peer/grpo_update.py' --model '$WORK/hf' \
      --batch '$WORK/batch.json' --threads $t >'$WORK/peer-update-r$r-t$t.json'"
  done
  echo "bench_peer: round $r of $rounds, MoE layer"
  run "moerl-moe-r$r" "$MOERL" bench moe "${MOE[@]}" --out "$WORK/moerl-moe-r$r.json"
  [ "$moerl_only" = 1 ] && continue
  run "peer-moe-r$r" sh -c "'$PY' '$ROOT/benchmarks/peer/peer_moe.py' --moerl-json '$WORK/moerl-moe-r$r.json' \
    >'$WORK/peer-moe-r$r.json'"
done

mkdir -p "$(dirname "$out")"
echo "bench_peer: $("$MOERL" --version | sed -n 2p); $(nproc) cores; rounds $rounds; threads $threads"
echo "bench_peer: $("$MOERL" --version | grep '^GEMM')"
python3 "$ROOT/benchmarks/peer/table.py" "$WORK" --out "$out" || die "the table could not be made"
[ "$moerl_only" = 1 ] && echo "bench_peer: the peer side was skipped (--moerl-only); scripts/bench_peer.sh --install enables it"
echo "bench_peer: table written to $out"
