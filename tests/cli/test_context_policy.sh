# rollout.context_policy on a family whose transcript outgrows the context
# budget (guess, many turns, in a 192-token budget), on a 4-rank job:
#   - end_episode (the default): episodes end at the budget, flagged truncated;
#   - drop_oldest_turns: the actors rebuild the context (task statement and
#     newest turns) and episodes go on; every step trains, with the behaviour
#     log-probs matching the learner's recomputation of each window (a small
#     |logp gap|: a window scored in the wrong context would not match) and
#     the actors' routing of every window replayed.
source "$(dirname "$0")/lib.sh" "$@"
pretrain_tiny
SMALL=(--set 'env.families=["guess"]' --set rollout.max_tokens_per_episode=192 --set rollout.max_tokens_per_turn=24
       --set optim.total_steps=4)

counter() {  # counter RUN ROLE NAME: the counter's value in the run's last metrics line (0 when absent)
  python3 - "$WORK/runs/$1/metrics.jsonl" "$2" "$3" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print(int(lines[-1]["roles"].get(sys.argv[2], {}).get("counters", {}).get(sys.argv[3], 0)))
PY
}

for policy in end_episode drop_oldest_turns; do
  "${LAUNCH[@]}" -n 4 train --config "$CONFIG" "${TINY[@]}" "${SMALL[@]}" --set run.name="$policy" \
    --set rollout.context_policy="$policy" --init "$TINY_BASE" >"$policy.txt" 2>&1 </dev/null
  expect_status 0 $? "train $policy"
  expect_contains "$policy.txt" "step 4/4 v4 |" "$policy: every step"
done

truncated=$(counter end_episode learner learner.truncated_episodes)
[ "$truncated" -gt 0 ] || fail "end_episode: no episode reached the budget (the test needs a transcript that outgrows it)"
[ "$(counter end_episode actor actor.context_rebuilds)" = 0 ] || fail "end_episode: a context was rebuilt"

rebuilt=$(counter drop_oldest_turns actor actor.context_rebuilds)
dropped=$(counter drop_oldest_turns actor actor.context_dropped_turns)
episodes=$(counter drop_oldest_turns learner learner.context_rebuilt_episodes)
echo "end_episode: $truncated episodes truncated; drop_oldest_turns: $rebuilt rebuilds, $dropped turns dropped, $episodes episodes trained on"
[ "$rebuilt" -gt 0 ] || fail "drop_oldest_turns: no context was rebuilt"
[ "$dropped" -ge "$rebuilt" ] || fail "drop_oldest_turns: $rebuilt rebuilds dropped only $dropped turns"
[ "$episodes" -gt 0 ] || fail "drop_oldest_turns: the learner trained on no rebuilt episode"
# Every window's routing was recorded, so the learner replays the actors' routing.
[ "$(counter drop_oldest_turns actor actor.routing_mismatch)" = 0 ] || fail "drop_oldest_turns: routing lost for some episodes"
python3 - drop_oldest_turns.txt <<'PY' || fail "drop_oldest_turns: behaviour and learner log-probs disagree"
import re, sys
gaps = [float(g) for g in re.findall(r"\|logp gap\| ([0-9.eE+-]+|nan|inf)", open(sys.argv[1]).read())]
assert len(gaps) >= 4, gaps
# Same weights (staleness <= 1 version) and the same contexts: far below a
# context mismatch, which moves log-probs by whole nats.
assert all(g == g and g < 0.2 for g in gaps), gaps
PY
finish
