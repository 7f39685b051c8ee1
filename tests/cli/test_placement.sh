# [cluster] placement = "host_groups" under mpirun: the processes on the
# training hosts become the learners whatever order the launcher started them
# in, and a layout that does not fit stops every rank with status 2 before any
# work, naming the group and its counts. One machine stands in for two hosts:
# a wrapper gives each launcher rank a host name through MOERL_HOST_NAME (the
# name placement matches; a container sets it to its node's name).
source "$(dirname "$0")/lib.sh" "$@"
pretrain_tiny

# Launcher ranks 1 and 3 run on "train-a", the others on "infer-b": the
# learners are not the launcher's first ranks.
cat >wrapper.sh <<WRAP
#!/usr/bin/env bash
case "\${OMPI_COMM_WORLD_RANK:-}" in
  1|3) export MOERL_HOST_NAME=train-a ;;
  *) export MOERL_HOST_NAME=\${WRAPPER_OTHER_HOST:-infer-b} ;;
esac
exec "$MOERL" "\$@"
WRAP
chmod +x wrapper.sh
PLACED=(env MOERL_BIN="$WORK/wrapper.sh" "$SOURCE_DIR/scripts/launch.sh" --max-restarts 0)
GROUPS_SET=(--set cluster.learners=2 --set cluster.actors=2 --set cluster.env_workers=1
            --set cluster.placement=host_groups --set 'cluster.training_hosts=["train-*"]')

run_job placed 240 "${PLACED[@]}" -n 5 train --config "$CONFIG" "${TINY[@]}" "${GROUPS_SET[@]}" \
  --set 'cluster.inference_hosts=["infer-*"]' --set optim.total_steps=3 --init "$TINY_BASE"
expect_status 0 $? "train placed by host groups"
for step in 1 2 3; do expect_contains placed.txt "step $step/3 v$step |" "progress line of step $step"; done
# Each job rank's record: its role and the host it matched (the wrapper gave
# train-a only to launcher ranks 1 and 3, so learners on train-a are those two
# processes, not the launcher's first ranks).
python3 - "$WORK/runs/quickstart" <<'PY' || fail "rank records of the placed job"
import json, sys
want = {0: ("learner", "train-a"), 1: ("learner", "train-a"), 2: ("actor", "infer-b"),
        3: ("actor", "infer-b"), 4: ("env_worker", "infer-b")}
for rank, (role, host) in want.items():
    r = json.load(open(f"{sys.argv[1]}/ranks/rank-{rank}.json"))
    assert r["rank"] == rank and r["role"] == role and r["placement_host"] == host, r
s = json.load(open(f"{sys.argv[1]}/summary.json"))
assert s["steps"] == 3, s
PY

# The dry run shows the plan: learners on train-a although the launcher's rank 0 is on infer-b.
run_job dry 120 "${PLACED[@]}" -n 5 train --config "$CONFIG" "${TINY[@]}" "${GROUPS_SET[@]}" --dry-run
expect_status 0 $? "dry run placed by host groups"
grep -Eq "^0 +learner 0 +train-a" dry.txt || { fail "dry run: rank 0 is not learner 0 on train-a"; sed 's/^/    | /' dry.txt; }
grep -Eq "^2 +actor 0 +infer-b" dry.txt || { fail "dry run: rank 2 is not actor 0 on infer-b"; sed 's/^/    | /' dry.txt; }

# Three processes for two learners: status 2 on every rank, before any work.
run_job too_many 120 "${PLACED[@]}" -n 5 train --config "$CONFIG" "${TINY[@]}" "${GROUPS_SET[@]}" \
  --set 'cluster.training_hosts=["train-*", "infer-b"]' --set run.name=too_many --init "$TINY_BASE"
expect_status 2 $? "a layout that does not fit"
expect_contains too_many.txt "cluster.placement" "the error names the key"
expect_contains too_many.txt "has 5 rank(s) for 2 learner(s)" "the error names the training group's counts"
expect_contains too_many.txt "(every rank stops with status 2)" "every rank stops"
[ -e "$WORK/runs/too_many/ranks/rank-0.json" ] && fail "a rank started work although the layout did not fit"

# A host in neither group: the rank and host are named.
run_job stray 120 env WRAPPER_OTHER_HOST=login "${PLACED[@]}" -n 5 train --config "$CONFIG" "${TINY[@]}" \
  "${GROUPS_SET[@]}" --set 'cluster.inference_hosts=["infer-*"]' --set run.name=stray --init "$TINY_BASE"
expect_status 2 $? "a host in neither group"
expect_contains stray.txt "rank 0 runs on host 'login', which matches neither" "the stray host is named"
expect_contains stray.txt "cluster.inference_hosts" "the error names the inference key"
finish
