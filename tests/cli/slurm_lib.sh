# A throw-away one-node Slurm cluster for the Slurm job tests. Source it after
# lib.sh; then `slurm_start` brings up munged, slurmctld and slurmd with their
# own config, key, sockets, ports, spool and state in $WORK/slurm, and waits
# until the nodes are idle. Nothing here touches a system munge or Slurm: every
# client command runs with SLURM_CONF pointing at this conf, and the conf
# names this munge socket. A daemon that cannot start fails the test (exit 1)
# with its log's tail: a test that needs Slurm must never pass without one.
#
# After slurm_start: SLURM_DIR, SLURM_CONF (exported), slurm_submit,
# slurm_wait_state, slurm_job_field, slurm_logs; the EXIT trap stops what
# slurm_start started (jobs cancelled first, then slurmd, slurmctld, munged).
SLURM_DIR="$WORK/slurm"
SLURM_PIDS=()  # "name:pid" of each daemon started here
# Two slurmd on this one host, as two nodes: Slurm's backfill scheduler,
# which alone starts heterogeneous jobs, plans whole nodes, so the two
# components of a hetjob never start on one node (it plans the second after
# the first has ended). NodeHostname maps both names to this host.
SLURM_HOST="$(hostname -s)"
SLURM_NODES=("$SLURM_HOST-n0" "$SLURM_HOST-n1")

slurm_die() {  # slurm_die REASON [LOG...]: the test fails here, naming why and showing the logs
  echo "FAILED: $1"
  shift
  local log
  for log in "$@"; do
    [ -f "$log" ] || continue
    echo "  last 30 lines of $log:"
    tail -n 30 "$log" | sed 's/^/    | /'
  done
  exit 1
}

slurm_stop() {
  # Jobs first: a job step's processes (slurmstepd, mpirun, the ranks) are not
  # children of slurmd, so stopping the daemons alone would leave them running.
  if [ -f "$SLURM_DIR/slurm.conf" ] && [ "${#SLURM_PIDS[@]}" -gt 0 ]; then
    scancel --full --signal=KILL --quiet --user="$(id -un)" 2>/dev/null
    scancel --quiet --user="$(id -un)" 2>/dev/null
    local deadline=$((SECONDS + 30))
    while [ $SECONDS -lt $deadline ] && [ -n "$(squeue -h -o %i 2>/dev/null)" ]; do sleep 1; done
  fi
  local entry pid i
  # In reverse order of starting: slurmd, slurmctld, then munged (the others authenticate through it).
  for ((i = ${#SLURM_PIDS[@]} - 1; i >= 0; i--)); do
    entry=${SLURM_PIDS[$i]}
    pid=${entry#*:}
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null
  done
  SLURM_PIDS=()
}
trap 'slurm_stop; rm -rf "$WORK"' EXIT

slurm_start() {
  local tool
  for tool in munged mungekey slurmctld slurmd sbatch srun squeue scontrol sinfo scancel; do
    command -v "$tool" >/dev/null || slurm_die "$tool is not installed (scripts/setup.sh installs Slurm and munge)"
  done
  command -v unshare >/dev/null || slurm_die "unshare (util-linux) is missing: the second slurmd needs a mount namespace"
  mkdir -p "$SLURM_DIR"/{munge,socket,spool,state,log,tmp}
  # munged wants its socket reachable by everyone (x on every directory above
  # it) and its key readable by it alone.
  chmod 711 "$WORK" "$SLURM_DIR"
  chmod 755 "$SLURM_DIR/socket"
  chmod 700 "$SLURM_DIR/munge"
  local user
  user=$(id -un)

  # munge: a key made for this test and a daemon on its own socket.
  local socket="$SLURM_DIR/socket/munge.socket"
  mungekey --create --keyfile="$SLURM_DIR/munge/munge.key" >"$SLURM_DIR/log/mungekey.log" 2>&1 ||
    slurm_die "mungekey could not make a key" "$SLURM_DIR/log/mungekey.log"
  chmod 400 "$SLURM_DIR/munge/munge.key"
  munged --foreground --socket="$socket" --key-file="$SLURM_DIR/munge/munge.key" \
    --pid-file="$SLURM_DIR/munge/munged.pid" --seed-file="$SLURM_DIR/munge/munged.seed" \
    --log-file="$SLURM_DIR/log/munged.log" >"$SLURM_DIR/log/munged.out" 2>&1 &
  SLURM_PIDS+=("munged:$!")
  local ok=0
  for _ in $(seq 1 50); do
    if munge -S "$socket" -n 2>/dev/null | unmunge -S "$socket" >/dev/null 2>&1; then ok=1; break; fi
    kill -0 "${SLURM_PIDS[-1]#*:}" 2>/dev/null || break
    sleep 0.2
  done
  [ $ok = 1 ] || slurm_die "munged did not start (no credential round trip on $socket)" \
    "$SLURM_DIR/log/munged.out" "$SLURM_DIR/log/munged.log"

  # The conf: two nodes on this host, each with as many CPUs as the host has;
  # the ranks' processes tracked by /proc (no cgroups in a container), no
  # task binding. Each slurmd has its own port, pid, log and TmpFS (%n: the node name).
  local ctld_port cpus node_lines="" node
  ctld_port=$(free_port)
  cpus=$(getconf _NPROCESSORS_ONLN)  # not nproc: it counts OMP_NUM_THREADS, which the test environment may set
  for node in "${SLURM_NODES[@]}"; do
    node_lines+="NodeName=$node NodeHostname=$SLURM_HOST NodeAddr=127.0.0.1 Port=$(free_port) CPUs=$cpus State=UNKNOWN"$'\n'
  done
  export SLURM_CONF="$SLURM_DIR/slurm.conf"
  cat >"$SLURM_CONF" <<EOF
ClusterName=moerltest
SlurmctldHost=$SLURM_HOST(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmUser=$user
SlurmdUser=$user
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$socket
StateSaveLocation=$SLURM_DIR/state
# One spool path for both slurmd, but not one directory: Slurm's PMIx plugin
# names a step's server socket there by job and step alone, and reaches a
# peer node's at the path of its own (no %n), so the second slurmd runs in a
# mount namespace of its own with another directory bound over this path.
SlurmdSpoolDir=$SLURM_DIR/spool
SlurmctldPidFile=$SLURM_DIR/slurmctld.pid
SlurmdPidFile=$SLURM_DIR/slurmd-%n.pid
SlurmctldLogFile=$SLURM_DIR/log/slurmctld.log
SlurmdLogFile=$SLURM_DIR/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# Per node: Slurm's PMIx plugin makes each step's client directory under it,
# named by job and step alone, so two nodes on one host need two TmpFS.
TmpFS=$SLURM_DIR/tmp/%n
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
JobRequeue=1
# Heterogeneous jobs are started by the backfill scheduler: every second, not every 30 s.
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1
# Jobs stay visible to scontrol for 10 minutes after they end (no slurmdbd, so no sacct).
MinJobAge=600
# A signalled step has this long before SIGKILL: time for moerl's checkpoint at the stop.
KillWait=60
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
PlugStackConfig=$SLURM_DIR/plugstack.conf
${node_lines}PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
  : >"$SLURM_DIR/plugstack.conf"

  slurmctld -D -c -f "$SLURM_CONF" >"$SLURM_DIR/log/slurmctld.out" 2>&1 &
  SLURM_PIDS+=("slurmctld:$!")
  ok=0
  for _ in $(seq 1 100); do
    scontrol ping 2>/dev/null | grep -q "is UP" && { ok=1; break; }
    kill -0 "${SLURM_PIDS[-1]#*:}" 2>/dev/null || break
    sleep 0.2
  done
  [ $ok = 1 ] || slurm_die "slurmctld did not start (scontrol ping)" "$SLURM_DIR/log/slurmctld.out" "$SLURM_DIR/log/slurmctld.log"

  local logs=()
  local first=1 mount_spool
  for node in "${SLURM_NODES[@]}"; do
    mkdir -p "$SLURM_DIR/tmp/$node" "$SLURM_DIR/spool-$node"
    if [ $first = 1 ]; then
      mount_spool=""
      first=0
    else
      mount_spool="mount --bind '$SLURM_DIR/spool-$node' '$SLURM_DIR/spool' || exit 97;"
    fi
    # unshare execs (no fork): the pid is slurmd's.
    unshare --mount --propagation private \
      bash -c "$mount_spool exec slurmd -D -f '$SLURM_CONF' -N '$node'" >"$SLURM_DIR/log/slurmd-$node.out" 2>&1 &
    SLURM_PIDS+=("slurmd-$node:$!")
    logs+=("$SLURM_DIR/log/slurmd-$node.out" "$SLURM_DIR/log/slurmd-$node.log")
  done
  local states="" want
  want=$(printf 'idle\n%.0s' "${SLURM_NODES[@]}")
  for _ in $(seq 1 150); do
    states=$(sinfo -h -N -o %T 2>/dev/null | sort)
    [ "$states" = "${want%$'\n'}" ] && break
    for entry in "${SLURM_PIDS[@]}"; do
      kill -0 "${entry#*:}" 2>/dev/null || slurm_die "${entry%%:*} exited" "${logs[@]}" "$SLURM_DIR/log/slurmctld.log"
    done
    sleep 0.2
  done
  [ "$states" = "${want%$'\n'}" ] || slurm_die "nodes ${SLURM_NODES[*]} not idle within 30 s (states: $(echo $states))" \
    "${logs[@]}" "$SLURM_DIR/log/slurmctld.log"
  echo "slurm: nodes ${SLURM_NODES[*]} idle ($cpus CPUs each, on this host), slurmctld on port $ctld_port, conf $SLURM_CONF"
}

slurm_submit() {  # slurm_submit SBATCH_ARGS...: prints the job id (sbatch --parsable); fails the test if sbatch does
  local out
  # Called in $(...): a failure is told on stderr, and the caller sees no id.
  out=$(sbatch --parsable "$@" 2>&1) || { echo "FAILED: sbatch $*: $out" >&2; return 1; }
  echo "${out%%;*}"
}

slurm_submit_moerl() {  # slurm_submit_moerl NAME SCRIPT [sbatch options]: the job id of scripts/slurm/SCRIPT
  # on the tests' tiny config for $STEPS steps (moerl overrides: TINY, then
  # $JOB_ARGS, then $EXTRA; environment: $ENVS, "VAR=value ..."); its run is
  # $WORK/runs/NAME and its output $WORK/out/NAME-JOBID.out. More ranks than
  # CPUs: --overcommit (one compute thread per rank: the scripts set it).
  local name=$1 script=$2
  shift 2
  mkdir -p "$WORK/out"
  (
    export MOERL_ROOT="$SOURCE_DIR" MOERL_BIN="$MOERL" MOERL_RUN_ROOT="$WORK/runs" MOERL_RUN_NAME="$name" \
      MOERL_INIT="$TINY_BASE" MOERL_SRUN_ARGS=--overcommit \
      MOERL_ARGS="${TINY[*]} --set optim.total_steps=$STEPS ${JOB_ARGS:-} ${EXTRA:-}"
    for kv in ${ENVS:-}; do export "${kv?}"; done
    slurm_submit --job-name="$name" --chdir="$WORK" --output="$WORK/out/%x-%j.out" "$@" "$SOURCE_DIR/scripts/slurm/$script"
  )
}

slurm_job_field() {  # slurm_job_field JOBID FIELD: one field of `scontrol show job` (the first component's for a hetjob)
  scontrol show job -o "$1" 2>/dev/null | head -n 1 | tr ' ' '\n' | sed -n "s/^$2=//p"
}

slurm_wait_state() {  # slurm_wait_state JOBID SECONDS STATE...: true once the job is in one of the STATEs
  local job=$1 deadline=$((SECONDS + $2)) state
  shift 2
  while [ $SECONDS -lt $deadline ]; do
    state=$(slurm_job_field "$job" JobState)
    for want in "$@"; do [ "$state" = "$want" ] && return 0; done
    sleep 1
  done
  echo "job $job: state '${state}' after the deadline, wanted $*"
  return 1
}

slurm_logs() {  # slurm_logs FILE...: the tails of the job's logs and of the daemons', after a failure
  local log
  for log in "$@" "$SLURM_DIR/log/slurmctld.log" "$SLURM_DIR"/log/slurmd-*.log; do
    [ -f "$log" ] || continue
    echo "  last 40 lines of $log:"
    tail -n 40 "$log" | sed 's/^/    | /'
  done
}
