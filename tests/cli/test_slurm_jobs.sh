# The sbatch scripts of scripts/slurm under a real Slurm (a throw-away one on
# this host, slurm_lib.sh: two nodes, 2 CPUs each): the single-node job
# (launch.sh, mpirun in the allocation), the heterogeneous job (learners in
# component 0, actor and env worker in component 1, one srun --mpi=pmix step)
# and the multi-node job with srun, also with roles placed by node name
# ([cluster] placement = "host_groups"). Each must end COMPLETED with exit 0, its
# run directory must hold every step (summary.json) and each role's ranks
# (ranks/rank-N.json), and in the hetjob each rank must have run in its
# component.
source "$(dirname "$0")/lib.sh" "$@"
source "$(dirname "$0")/slurm_lib.sh"
slurm_start
pretrain_tiny
STEPS=3

check_job() {  # check_job NAME JOBID LEARNERS ACTORS ENV_WORKERS
  local name=$1 job=$2 out="$WORK/out/$1-$2.out"
  [ -n "$job" ] || { fail "$name: not submitted"; return; }
  if ! slurm_wait_state "$job" 90 COMPLETED FAILED CANCELLED TIMEOUT NODE_FAIL OUT_OF_MEMORY; then
    fail "$name (job $job) did not end within 90 s"; slurm_logs "$out"; return
  fi
  local state code
  state=$(slurm_job_field "$job" JobState)
  code=$(slurm_job_field "$job" ExitCode)
  echo "job $name ($job): $state, exit code $code"
  if [ "$state" != COMPLETED ] || [ "$code" != 0:0 ]; then
    fail "$name (job $job): $state with exit code $code"; slurm_logs "$out"; return
  fi
  expect_contains "$out" "steps $STEPS, wall" "$name: moerl's last line"
  python3 - "$WORK/runs/$name" "$STEPS" "$3" "$4" "$5" "${6:-}" <<'PY' || { fail "$name: run directory"; slurm_logs "$out"; }
import collections, glob, json, sys
run, steps, learners, actors, env_workers, hosts = sys.argv[1], int(sys.argv[2]), *map(int, sys.argv[3:6]), sys.argv[6]
summary = json.load(open(run + "/summary.json"))
assert summary["steps"] == steps, ("steps", summary["steps"])
records = [json.load(open(f)) for f in glob.glob(run + "/ranks/rank-*.json")]
roles = collections.Counter(r["role"] for r in records)
assert roles == {"learner": learners, "actor": actors, "env_worker": env_workers}, roles
if hosts:  # learners on the first host named, the rest on the second
    train, infer = hosts.split(",")
    for r in records:
        want = train if r["role"] == "learner" else infer
        assert r["placement_host"] == want, (r["rank"], r["role"], r["placement_host"], want)
print(run, "steps", summary["steps"], "roles", dict(roles))
PY
}

single=$(slurm_submit_moerl single single_node.sbatch --ntasks=4 --overcommit)
# 2 + 2: with Slurm 22.05 and this Open MPI, a het step whose component has 3
# tasks on a node while the other has 1 fails in MPI_Init (both 2 + 2 and 1 + 2 work).
het=$(EXTRA="--set cluster.actors=1 --set cluster.env_workers=1" ENVS="MOERL_HOST_NAME_0=train-0 MOERL_HOST_NAME_1=infer-0" \
  slurm_submit_moerl het hetjob.sbatch --ntasks=2 --overcommit : --ntasks=2 --overcommit)
multi=$(ENVS="MOERL_LAUNCHER=srun" slurm_submit_moerl multi multi_node.sbatch --nodes=2 --ntasks-per-node=2 --overcommit)
# Placement by the nodes' own names (Slurm's SLURMD_NODENAME, no stand-ins):
# the training hosts are the second node, whose tasks srun numbers last, so
# the learners are not where rank order would put them.
placed=$(ENVS="MOERL_LAUNCHER=srun" EXTRA="--set cluster.learners=2 --set cluster.actors=1 --set cluster.placement=host_groups --set cluster.training_hosts=[\"*-n1\"]" \
  slurm_submit_moerl placed multi_node.sbatch --nodes=2 --ntasks-per-node=2 --overcommit)
echo "submitted: single $single, het $het, multi $multi, placed $placed"
check_job single "$single" 1 2 1
check_job het "$het" 2 1 1 train-0,infer-0
# The hetjob's components ran on different nodes.
n0=$(scontrol show job -o "$het" | sed -n '1s/.* NodeList=\([^ ]*\).*/\1/p')
n1=$(scontrol show job -o "$het" | sed -n '2s/.* NodeList=\([^ ]*\).*/\1/p')
[ -n "$n0" ] && [ "$n0" != "$n1" ] || fail "het: components on nodes '$n0' and '$n1', expected two nodes"
check_job multi "$multi" 1 2 1
check_job placed "$placed" 2 1 1 "${SLURM_NODES[1]},${SLURM_NODES[0]}"
finish
