# A throw-away one-node Slurm cluster for the Slurm job tests. Source it after
# lib.sh; then `slurm_start` brings up munged, slurmctld and slurmd with their
# own config, key, sockets, ports, spool and state in $WORK/slurm, and waits
# until the node is idle. Nothing here touches a system munge or Slurm: every
# client command runs with SLURM_CONF pointing at this conf, and the conf
# names this munge socket. A daemon that cannot start fails the test (exit 1)
# with its log's tail: a test that needs Slurm must never pass without one.
#
# After slurm_start: SLURM_DIR, SLURM_CONF (exported), slurm_submit,
# slurm_wait_state, slurm_job_field, slurm_logs; the EXIT trap stops what
# slurm_start started (jobs cancelled first, then slurmd, slurmctld, munged).
SLURM_DIR="$WORK/slurm"
SLURM_PIDS=()  # "name:pid" of each daemon started here
SLURM_NODE="$(hostname -s)"

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

free_port() {  # a TCP port nothing listens on now (another Slurm on this host keeps its own)
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

slurm_start() {
  local tool
  for tool in munged mungekey slurmctld slurmd sbatch srun squeue scontrol sinfo scancel; do
    command -v "$tool" >/dev/null || slurm_die "$tool is not installed (scripts/setup.sh installs Slurm and munge)"
  done
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

  # The conf: one node, this host, as many CPUs as it has; the ranks' processes
  # tracked by /proc (no cgroups in a container), no task binding.
  local ctld_port slurmd_port cpus
  ctld_port=$(free_port)
  slurmd_port=$(free_port)
  [ "$ctld_port" != "$slurmd_port" ] || slurmd_port=$(free_port)
  cpus=$(nproc)
  export SLURM_CONF="$SLURM_DIR/slurm.conf"
  cat >"$SLURM_CONF" <<EOF
ClusterName=moerltest
SlurmctldHost=$SLURM_NODE(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=$user
SlurmdUser=$user
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$socket
StateSaveLocation=$SLURM_DIR/state
SlurmdSpoolDir=$SLURM_DIR/spool
SlurmctldPidFile=$SLURM_DIR/slurmctld.pid
SlurmdPidFile=$SLURM_DIR/slurmd.pid
SlurmctldLogFile=$SLURM_DIR/log/slurmctld.log
SlurmdLogFile=$SLURM_DIR/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
TmpFS=$SLURM_DIR/tmp
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
NodeName=$SLURM_NODE NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=test Nodes=$SLURM_NODE Default=YES MaxTime=INFINITE State=UP
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

  slurmd -D -f "$SLURM_CONF" -N "$SLURM_NODE" >"$SLURM_DIR/log/slurmd.out" 2>&1 &
  SLURM_PIDS+=("slurmd:$!")
  local state=""
  for _ in $(seq 1 150); do
    state=$(sinfo -h -N -n "$SLURM_NODE" -o %T 2>/dev/null)
    [ "$state" = idle ] && break
    kill -0 "${SLURM_PIDS[-1]#*:}" 2>/dev/null || break
    sleep 0.2
  done
  [ "$state" = idle ] || slurm_die "node $SLURM_NODE not idle within 30 s (state '${state}')" \
    "$SLURM_DIR/log/slurmd.out" "$SLURM_DIR/log/slurmd.log" "$SLURM_DIR/log/slurmctld.log"
  echo "slurm: node $SLURM_NODE idle ($cpus CPUs), slurmctld on port $ctld_port, conf $SLURM_CONF"
}

slurm_submit() {  # slurm_submit SBATCH_ARGS...: prints the job id (sbatch --parsable); fails the test if sbatch does
  local out
  out=$(sbatch --parsable "$@" 2>&1) || slurm_die "sbatch $* failed: $out" "$SLURM_DIR/log/slurmctld.log"
  echo "${out%%;*}"
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
  for log in "$@" "$SLURM_DIR/log/slurmctld.log" "$SLURM_DIR/log/slurmd.log"; do
    [ -f "$log" ] || continue
    echo "  last 40 lines of $log:"
    tail -n 40 "$log" | sed 's/^/    | /'
  done
}
