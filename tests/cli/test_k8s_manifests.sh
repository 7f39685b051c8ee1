# The Kubernetes deployment (configs/k8s/, Dockerfile, Dockerfile.cuda), checked
# offline: built-in kinds and the MPIJob's pod templates against Kubernetes' own
# schemas (kubernetes-validate, strict), the MPIJob against configs/k8s/schema/
# (check-jsonschema), and the facts moerl needs: a valid embedded config, as many
# ranks started as the config has, every path the command uses mounted. The
# pools variant (configs/k8s/pools/: StatefulSets in two node pools and a
# launcher Job) also: its launcher's script run with stubs for ssh and
# launch.sh, the hostfile it writes against the StatefulSets, the placement and
# GPUs that follow, mpirun's own map of that hostfile, and a moerl dry run with
# the pods' host names. Broken copies must be rejected, so that each check is
# shown able to fail.
# The checkers come from scripts/setup.sh (.deploy-tools/); without them this
# test fails, it does not skip.
# lib.sh works in a temporary directory: relative arguments are made absolute first.
moerl_arg=$(realpath -- "${1:?usage: test_k8s_manifests.sh MOERL_BINARY SOURCE_DIR}")
source_arg=$(realpath -- "${2:?usage: test_k8s_manifests.sh MOERL_BINARY SOURCE_DIR}")
source "$(dirname "$0")/lib.sh" "$moerl_arg" "$source_arg"
K8S="$SOURCE_DIR/configs/k8s"
SCHEMA="$K8S/schema/mpijob-v2beta1.json"
TOOLS="$SOURCE_DIR/.deploy-tools"
# Kubernetes API version the manifests are written against: fixed, so that a
# new checker release does not change the verdict.
KUBE_VERSION=1.33.0

# The venv's scripts are run through its python: a venv built in one place and
# moved (setup.sh builds .deploy-tools.partial, then renames it) keeps the old
# path in its scripts' #! lines.
PY="$TOOLS/bin/python"
for tool in kubernetes-validate check-jsonschema; do
  if [ ! -x "$PY" ] || [ ! -f "$TOOLS/bin/$tool" ]; then
    fail "$tool is missing from $TOOLS (run scripts/setup.sh, which installs scripts/requirements-deploy.txt)"
    finish
  fi
done
kv() { "$PY" "$TOOLS/bin/kubernetes-validate" --kubernetes-version "$KUBE_VERSION" --strict "$@"; }
cj() { "$PY" "$TOOLS/bin/check-jsonschema" "$@"; }

# config_facts TOML: `moerl config check`, cluster.ranks, run.directory and the
# resolved config (`config show`) of TOML into the directory $cfg, once per
# content (the broken copies mostly share the committed config); prints the
# findings ("REJECT: ..." lines), nothing when the config passed. Call it
# with its output redirected, not in $(...): it sets $cfg.
CACHE="$WORK/config-cache"
mkdir -p "$CACHE"
config_facts() {
  local out
  cfg="$CACHE/$(sha256sum "$1" | cut -c1-16)"
  if [ ! -d "$cfg" ]; then
    mkdir -p "$cfg.partial"
    {
      if ! out=$("$MOERL" config check "$1" 2>&1); then echo "REJECT: moerl config check: $out"
      else
        # A valid config: the three reads at once (each is a start of moerl).
        local get_ranks get_rundir show
        "$MOERL" config get "$1" cluster.ranks >"$cfg.partial/ranks" 2>&1 & get_ranks=$!
        "$MOERL" config get "$1" run.directory >"$cfg.partial/rundir" 2>&1 & get_rundir=$!
        "$MOERL" config show "$1" >"$cfg.partial/show.toml" 2>&1 & show=$!
        wait "$get_ranks" || echo "REJECT: moerl config get cluster.ranks: $(cat "$cfg.partial/ranks")"
        wait "$get_rundir" || echo "REJECT: moerl config get run.directory: $(cat "$cfg.partial/rundir")"
        wait "$show" || echo "REJECT: moerl config show: $(cat "$cfg.partial/show.toml")"
      fi
    } >"$cfg.partial/findings"
    mv "$cfg.partial" "$cfg"
  fi
  cat "$cfg/findings"
}

# checks DIR: every check on the manifests in DIR; prints one "REJECT: ..." line
# per finding, so that the negative cases can tell which check caught them.
checks() {
  local dir=$1 out
  out=$(kv "$dir/pvc.yaml" "$dir/configmap.yaml" 2>&1) || echo "REJECT: kubernetes-validate pvc/configmap: $out"
  out=$(cj --schemafile "$SCHEMA" "$dir/mpijob.yaml" 2>&1) || echo "REJECT: MPIJob schema: $out"
  # Extract each pod template into a v1 PodTemplate (whose .template is a
  # PodTemplateSpec, as in the MPIJob), the embedded TOML, and the facts.
  rm -rf "$dir/extracted" && mkdir -p "$dir/extracted"
  "$PY" - "$dir" <<'PY' || echo "REJECT: extraction failed"
import sys, yaml
d = sys.argv[1]
job = yaml.safe_load(open(f"{d}/mpijob.yaml"))
cm = yaml.safe_load(open(f"{d}/configmap.yaml"))
specs = job.get("spec", {}).get("mpiReplicaSpecs", {})
for kind, spec in specs.items():
    tmpl = {"apiVersion": "v1", "kind": "PodTemplate",
            "metadata": {"name": f"{job['metadata']['name']}-{kind.lower()}"},
            "template": spec.get("template")}
    yaml.safe_dump(tmpl, open(f"{d}/extracted/podtemplate-{kind}.yaml", "w"))
open(f"{d}/extracted/moerl.toml", "w").write(cm["data"]["moerl.toml"])
PY
  for t in "$dir"/extracted/podtemplate-*.yaml; do
    out=$(kv "$t" 2>&1) || echo "REJECT: kubernetes-validate $(basename "$t"): $out"
  done
  local toml="$dir/extracted/moerl.toml"
  config_facts "$toml" >"$dir/extracted/config-findings"
  [ -s "$dir/extracted/config-findings" ] && { cat "$dir/extracted/config-findings"; return; }
  local ranks rundir
  ranks=$(cat "$cfg/ranks") rundir=$(cat "$cfg/rundir")
  # A crash of the checker is a finding too; the last line marks a complete pass.
  "$PY" - "$dir" "$ranks" "$rundir" <<'PY' || echo "REJECT: the moerl facts check crashed"
import sys, yaml, posixpath
d, ranks, rundir = sys.argv[1], int(sys.argv[2]), sys.argv[3]
job = yaml.safe_load(open(f"{d}/mpijob.yaml"))
cm = yaml.safe_load(open(f"{d}/configmap.yaml"))
spec = job["spec"]
def reject(why): print("REJECT:", why)
try:
    launcher = spec["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]
    worker_spec = spec["mpiReplicaSpecs"]["Worker"]
    worker = worker_spec["template"]["spec"]
    workers, slots = int(worker_spec["replicas"]), int(spec.get("slotsPerWorker", 1))
except (KeyError, TypeError, ValueError) as e:
    reject(f"MPIJob structure: {e!r}"); sys.exit(0)
started = workers * slots + (slots if spec.get("runLauncherAsWorker") else 0)
if started != ranks:
    reject(f"the MPIJob starts {workers} workers x {slots} slots = {started} ranks, the config's cluster.ranks is {ranks}")
main = launcher["containers"][0]
argv = list(main.get("command", [])) + list(main.get("args", []))
if not argv or not argv[0].endswith("scripts/launch.sh"):
    reject(f"the launcher does not run scripts/launch.sh: {argv}")
def value(flag):
    return argv[argv.index(flag) + 1] if flag in argv and argv.index(flag) + 1 < len(argv) else None
n = value("-n") or value("--ranks")
if n != str(ranks):
    reject(f"launch.sh -n {n}, the config's cluster.ranks is {ranks}")
if "train" not in argv or value("--resume") != "auto":
    reject("the launcher must run `train ... --resume auto` (a retried pod resumes its checkpoint)")
if value("--hostfile") is None and "/etc/mpi/hostfile" not in argv:
    reject("mpirun is not given the operator's hostfile /etc/mpi/hostfile")
def mounted(pod, path, kind):
    # The volume (of this kind: configMap or persistentVolumeClaim) whose mount holds path.
    vols = {v["name"]: v for v in pod.get("volumes", [])}
    for c in pod["containers"] + pod.get("initContainers", []):
        for m in c.get("volumeMounts", []):
            mp = m["mountPath"].rstrip("/")
            if (path == mp or path.startswith(mp + "/")) and kind in vols.get(m["name"], {}):
                return vols[m["name"]][kind], posixpath.relpath(path, mp)
    return None, None
config_path = value("--config")
for role, pod in (("launcher", launcher), ("worker", worker)):
    # Every rank reads the config and writes under the run directory.
    source, key = mounted(pod, config_path or "", "configMap")
    if source is None or source.get("name") != cm["metadata"]["name"] or key not in cm["data"]:
        reject(f"{role}: --config {config_path} is not the ConfigMap {cm['metadata']['name']}'s key mounted there")
    if mounted(pod, rundir, "persistentVolumeClaim")[0] is None:
        reject(f"{role}: the run directory {rundir} is on no mounted PersistentVolumeClaim")
    if int(pod.get("terminationGracePeriodSeconds", 30)) < 120:
        reject(f"{role}: terminationGracePeriodSeconds under 120 s leaves no time for the save on SIGTERM")
init = value("--init")
if init and mounted(launcher, init, "persistentVolumeClaim")[0] is None:
    reject(f"launcher: --init {init} is on no mounted PersistentVolumeClaim")
if spec.get("runPolicy", {}).get("backoffLimit", 0) < 1:
    reject("runPolicy.backoffLimit < 1: a failed launcher is never retried")
print(f"CHECKED: {started} ranks, config {config_path}, run directory {rundir}")
PY
}

# The manifests as committed: no finding at all.
cp -r "$K8S" good
checks good >good.txt
if grep -q REJECT good.txt || ! grep -q '^CHECKED: ' good.txt; then
  fail "configs/k8s/ is rejected (or not every check ran)"; sed 's/^/    | /' good.txt
fi
[ -s good/extracted/podtemplate-Launcher.yaml ] && [ -s good/extracted/podtemplate-Worker.yaml ] ||
  fail "the pod templates were not extracted"

# broken NAME EXPECTED PYTHON: a copy edited by PYTHON (d = the MPIJob, c = the
# ConfigMap, both dicts) must be rejected with a finding containing EXPECTED.
broken() {
  local name=$1 expected=$2 edit=$3
  rm -rf "$name" && cp -r "$K8S" "$name"
  "$PY" - "$name" "$edit" <<'PY'
import sys, yaml
d_path, c_path = f"{sys.argv[1]}/mpijob.yaml", f"{sys.argv[1]}/configmap.yaml"
d, c = yaml.safe_load(open(d_path)), yaml.safe_load(open(c_path))
exec(sys.argv[2])
yaml.safe_dump(d, open(d_path, "w")); yaml.safe_dump(c, open(c_path, "w"))
PY
  checks "$name" >"$name.txt"
  grep -q "REJECT: .*$expected" "$name.txt" || { fail "$name: not rejected for '$expected'"; sed 's/^/    | /' "$name.txt"; }
}
broken replicas_string "MPIJob schema" 'd["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] = "2"'
broken unknown_field "MPIJob schema" 'd["spec"]["slotPerWorker"] = 4'
broken no_launcher "MPIJob schema" 'del d["spec"]["mpiReplicaSpecs"]["Launcher"]'
broken rank_count "cluster.ranks is 8" 'd["spec"]["slotsPerWorker"] = 3'
broken launch_n "launch.sh -n 6" 'a = d["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["args"]; a[a.index("-n") + 1] = "6"'
broken config_ranks "cluster.ranks is 9" 'c["data"]["moerl.toml"] = c["data"]["moerl.toml"].replace("actors = 5", "actors = 6")'
broken bad_toml "moerl config check" 'c["data"]["moerl.toml"] += "\n[optim]\nlr = \"fast\"\n"'
broken pod_field "podtemplate-Worker" 'd["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"] = [16]'
broken pod_unknown "podtemplate-Launcher" 'd["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["terminationGracePeriod"] = 300'
broken no_pvc_mount "run directory" 'w = d["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]; w["volumeMounts"] = [m for m in w["volumeMounts"] if m["name"] != "runs"]'
broken config_path "is not the ConfigMap" 'a = d["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["args"]; a[a.index("--config") + 1] = "/etc/moerl/other.toml"'
# A PVC with a misspelt field and a malformed quantity (edited as text).
rm -rf pvc_bad && cp -r "$K8S" pvc_bad && sed -i 's/storage: 100Gi/storage: lots/; s/accessModes:/accessMode:/' pvc_bad/pvc.yaml
checks pvc_bad >pvc_bad.txt
grep -q "REJECT: kubernetes-validate pvc" pvc_bad.txt || { fail "a broken PVC is not rejected"; sed 's/^/    | /' pvc_bad.txt; }

# ---------------------------------------------------------------------------
# The pools variant (configs/k8s/pools/): standard kinds only.
POOLS="$K8S/pools"
MPIEXEC=$("$MOERL" --mpiexec)
open_mpi_5() { "$MPIEXEC" --version 2>/dev/null | grep -q "Open MPI.* 5\|(Open MPI) 5"; }

# pools_checks DIR [map] [dry]: every check on the pools manifests in DIR, one
# "REJECT: ..." line per finding. map: mpirun's own map of the launcher's
# hostfile must be the one the placement check assumed; dry: a moerl dry run
# with the pods' host names must place every role as assumed.
pools_checks() {
  local dir stage f out
  dir=$(realpath -- "$1")  # the launcher's script runs in a directory of its own
  shift
  # Built-in kinds, strict, in one run of the checker; a file that passed once
  # (same content) is not checked again.
  local unchecked=()
  for f in "$dir"/*.yaml; do
    [ -f "$CACHE/kv-$(sha256sum "$f" | cut -c1-16)" ] || unchecked+=("$f")
  done
  if [ ${#unchecked[@]} -gt 0 ]; then
    out=$(kv "${unchecked[@]}" 2>&1)
    for f in "${unchecked[@]}"; do
      if grep -qF "INFO $f passed" <<<"$out" && ! grep -qF "ERROR $f" <<<"$out"; then touch "$CACHE/kv-$(sha256sum "$f" | cut -c1-16)"
      else echo "REJECT: kubernetes-validate $(basename "$f"): $(grep -F "$f" <<<"$out")"; fi
    done
  fi
  rm -rf "$dir/run" && mkdir -p "$dir/run"
  "$PY" - "$dir" <<'PY' || echo "REJECT: extraction failed"
import sys, glob, yaml
d = sys.argv[1]
for f in glob.glob(f"{d}/*.yaml"):
    for doc in yaml.safe_load_all(open(f)):
        if doc and doc.get("kind") == "ConfigMap" and "moerl.toml" in doc.get("data", {}):
            open(f"{d}/run/moerl.toml", "w").write(doc["data"]["moerl.toml"])
PY
  [ -s "$dir/run/moerl.toml" ] || { echo "REJECT: no ConfigMap with a moerl.toml key"; return; }
  config_facts "$dir/run/moerl.toml" >"$dir/run/config-findings"
  [ -s "$dir/run/config-findings" ] && { cat "$dir/run/config-findings"; return; }
  # The launcher's script, run as the container would (its env, its working
  # directory) with stubs: ssh logs in at once, scripts/launch.sh records its
  # arguments. Then the facts; the plan (launcher rank, pod, local rank, role)
  # goes to run/plan.txt for the map and dry-run checks.
  "$PY" - "$dir" "$(cat "$cfg/ranks")" "$(cat "$cfg/rundir")" "$cfg/show.toml" <<'PY' || echo "REJECT: the pools facts check crashed"
import fnmatch, glob, os, posixpath, subprocess, sys, tomllib, yaml
d, ranks, rundir, show = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
run = f"{d}/run"
def reject(why): print("REJECT:", why)
cfg = tomllib.load(open(show, "rb"))
cl = cfg["cluster"]
kinds = {}
for f in sorted(glob.glob(f"{d}/*.yaml")):
    for doc in yaml.safe_load_all(open(f)):
        if doc:
            kinds.setdefault(doc["kind"], {})[doc["metadata"]["name"]] = doc
try:
    sts = kinds["StatefulSet"]
    services = kinds.get("Service", {})
    (job,) = kinds["Job"].values()
    cm = next(c for c in kinds["ConfigMap"].values() if "moerl.toml" in c.get("data", {}))
    pvcs = kinds.get("PersistentVolumeClaim", {})
    launcher = job["spec"]["template"]["spec"]
    main = launcher["containers"][0]
    pods = {name: s["spec"]["template"]["spec"] for name, s in sts.items()}
except (KeyError, TypeError, ValueError, StopIteration) as e:
    reject(f"manifest structure: {e!r}"); sys.exit(0)

# The launcher's script, with stubs.
os.makedirs(f"{run}/sandbox/scripts"); os.makedirs(f"{run}/sandbox/bin")
def stub(path, body):
    open(path, "w").write("#!/bin/sh\n" + body); os.chmod(path, 0o755)
stub(f"{run}/sandbox/bin/ssh", f'echo "$@" >>{run}/ssh.log\nexit ${{STUB_SSH_STATUS:-0}}\n')
stub(f"{run}/sandbox/scripts/launch.sh", f'printf "%s\\n" "$@" >{run}/argv\n')
env = {e["name"]: e.get("value", "") for e in main.get("env", [])}
env.update(PATH=f"{run}/sandbox/bin:" + os.environ["PATH"], MOERL_HOSTFILE=f"{run}/hostfile")
script = list(main.get("command", [])) + list(main.get("args", []))
r = subprocess.run(script, env=env, cwd=f"{run}/sandbox", capture_output=True, text=True, timeout=60)
if r.returncode != 0 or not os.path.exists(f"{run}/argv"):
    reject(f"the launcher's script failed (exit {r.returncode}): {r.stderr.strip()[-400:]}"); sys.exit(0)
# A rank host that never answers: the launcher must give up (exit non-zero), not wait forever.
argv = open(f"{run}/argv").read().splitlines()
r2 = subprocess.run(script, env=dict(env, STUB_SSH_STATUS="255", MOERL_WAIT_S="0",
                    MOERL_HOSTFILE=f"{run}/hostfile-unreachable"), cwd=f"{run}/sandbox",
                    capture_output=True, text=True, timeout=60)
if r2.returncode == 0:
    reject("the launcher's script goes on when a rank host never answers ssh")
def value(flag):
    return argv[argv.index(flag) + 1] if flag in argv and argv.index(flag) + 1 < len(argv) else None
mpi_args = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--mpi-arg"]
open(f"{run}/mpi-args", "w").write("\n".join(mpi_args) + "\n")

# The hostfile against the Service and the StatefulSets.
hosts = []
for line in open(f"{run}/hostfile").read().splitlines():
    name, _, slots = line.partition(" slots=")
    pod, _, service = name.partition(".")
    hosts.append((pod, service, int(slots)))
named = [h[0] for h in hosts]
for pod, service, slots in hosts:
    owner, _, index = pod.rpartition("-")
    s = sts.get(owner)
    if s is None or not index.isdigit() or int(index) >= int(s["spec"]["replicas"]):
        reject(f"the hostfile names {pod}, which no StatefulSet creates"); continue
    if s["spec"].get("serviceName") != service or service not in services:
        reject(f"the hostfile names {pod}.{service}, but StatefulSet {owner}'s pods are named through the "
               f"Service {s['spec'].get('serviceName')!r}")
    if slots < 1:
        reject(f"{pod}: {slots} slots")
for name, s in sts.items():
    want = [f"{name}-{i}" for i in range(int(s["spec"]["replicas"]))]
    if [p for p in named if p.rpartition("-")[0] == name] != want:
        reject(f"StatefulSet {name} has {len(want)} pods, the hostfile names "
               f"{[p for p in named if p.rpartition('-')[0] == name]}: each pod once, in order")
    svc = services.get(s["spec"].get("serviceName"))
    if svc is None:
        reject(f"StatefulSet {name}: no Service {s['spec'].get('serviceName')!r} in the manifests")
        continue
    if svc["spec"].get("clusterIP") != "None":
        reject(f"Service {svc['metadata']['name']} is not headless (clusterIP: None): its pods get no DNS names of their own")
    labels = s["spec"]["template"]["metadata"].get("labels", {})
    if any(labels.get(k) != v for k, v in svc["spec"].get("selector", {}).items()):
        reject(f"Service {svc['metadata']['name']}'s selector does not select StatefulSet {name}'s pods")

# Ranks.
started = sum(h[2] for h in hosts)
if started != ranks:
    reject(f"the hostfile gives {started} slots, the config's cluster.ranks is {ranks}")
if value("-n") != str(ranks):
    reject(f"launch.sh -n {value('-n')}, the config's cluster.ranks is {ranks}")
if "train" not in argv or value("--resume") != "auto":
    reject("the launcher must run `train ... --resume auto` (a retried pod resumes its checkpoint)")
given = mpi_args[mpi_args.index("--hostfile") + 1] if "--hostfile" in mpi_args[:-1] else None
if given != f"{run}/hostfile":
    reject(f"mpirun is not given the hostfile the script wrote (--hostfile {given})")

# Placement: mpirun fills each host's slots in hostfile order (checked against
# mpirun itself in the map stage); host_groups gives the processes on
# training_hosts the learner ranks and the others, in that order, the actor,
# env worker and standby actor ranks.
pool = {}
for name, s in sts.items():
    p = s["spec"]["template"]["metadata"].get("labels", {}).get("moerl/pool")
    if p not in ("training", "inference"):
        reject(f"StatefulSet {name}: its pods' label moerl/pool is {p!r}, not training or inference")
    for i in range(int(s["spec"]["replicas"])):
        pool[f"{name}-{i}"] = (p, name)
if cl["placement"] != "host_groups":
    reject(f"cluster.placement is {cl['placement']!r}: the learners would be the first ranks, wherever they run, "
           "not the training pods' processes (host_groups)")
train_globs, inf_globs = cl["training_hosts"], cl["inference_hosts"]
def matches(host, globs): return any(fnmatch.fnmatchcase(host, g) for g in globs)
for pod, (p, _) in sorted(pool.items()):
    if p == "training":
        if not matches(pod, train_globs):
            reject(f"training_hosts {train_globs} does not match training pod {pod}")
        if inf_globs and matches(pod, inf_globs):
            reject(f"inference_hosts {inf_globs} matches training pod {pod}")
    elif p == "inference":
        if matches(pod, train_globs):
            reject(f"training_hosts {train_globs} matches inference pod {pod}")
        if inf_globs and not matches(pod, inf_globs):
            reject(f"inference_hosts {inf_globs} does not match inference pod {pod}")
procs = [(pod, local) for pod, _, slots in hosts for local in range(slots)]
training = [p for p in procs if matches(p[0], train_globs)]
inference = [p for p in procs if not matches(p[0], train_globs)]
others = cl["actors"] + cl["env_workers"] + cl["standby_actors"]
if len(training) != cl["learners"]:
    reject(f"the training pods have {len(training)} slots for {cl['learners']} learners (cluster.learners)")
if len(inference) != others:
    reject(f"the inference pods have {len(inference)} slots for {others} actor, env worker and standby actor ranks")
role_of = {}
for i, p in enumerate(training):
    role_of[p] = ("learner", i)
inference_roles = ([("actor", i) for i in range(cl["actors"])] + [("env_worker", i) for i in range(cl["env_workers"])]
                   + [("standby_actor", i) for i in range(cl["standby_actors"])])
for p, role in zip(inference, inference_roles):
    role_of[p] = role
with open(f"{run}/plan.txt", "w") as plan:
    for rank, p in enumerate(procs):
        plan.write(f"{rank} {p[0]} {p[1]} {role_of.get(p, ('none', 0))[0]}\n")

# GPUs: learners and actors each on a GPU of their own (cuda:local rank).
def gpus(pod_name):
    res = pods[pool[pod_name][1]]["containers"][0].get("resources", {})
    return res.get("requests", {}).get("nvidia.com/gpu"), res.get("limits", {}).get("nvidia.com/gpu")
gpu_roles = {"learner", "actor", "standby_actor"}
requested = {pod for pod in pool if gpus(pod)[1] is not None}
if requested and cfg["run"]["device"] != "cuda":
    reject(f"run.device is {cfg['run']['device']!r}: the GPUs that {sorted(requested)} request go unused")
for pod in sorted({p[0] for p in procs if p[0] in pool}):
    runs = {role_of.get(p, ("none", 0))[0] for p in procs if p[0] == pod}
    req, lim = gpus(pod)
    if runs & gpu_roles:
        if req is None or lim is None or str(req) != str(lim):
            reject(f"{pod} runs {'/'.join(sorted(runs & gpu_roles))} ranks but does not request GPUs "
                   f"(nvidia.com/gpu requests {req}, limits {lim})")
            continue
        for p in procs:
            if p[0] == pod and role_of.get(p, ("none",))[0] in gpu_roles and p[1] >= int(lim):
                reject(f"{pod}: the {role_of[p][0]} at local rank {p[1]} has no GPU of its own "
                       f"(nvidia.com/gpu {lim}; cuda:{p[1] % int(lim)} is shared)")
    elif lim is not None:
        reject(f"{pod} requests {lim} GPU(s) but runs only {'/'.join(sorted(runs))} ranks (CPU)")

# Node pools: the training and the inference StatefulSets ask for different ones.
selectors = {p: [(n, pods[n].get("nodeSelector")) for n in sts if pool.get(f"{n}-0", (None,))[0] == p]
             for p in ("training", "inference")}
for tn, ts in selectors["training"]:
    for inn, ins in selectors["inference"]:
        if not ts or ts == ins:
            reject(f"StatefulSets {tn} and {inn} share a node pool (nodeSelector {ts} and {ins})")

# Mounts, the ssh Secret, the grace period.
def mounted(pod, path, kind):
    vols = {v["name"]: v for v in pod.get("volumes", [])}
    for c in pod["containers"] + pod.get("initContainers", []):
        for m in c.get("volumeMounts", []):
            mp = m["mountPath"].rstrip("/")
            if (path == mp or path.startswith(mp + "/")) and kind in vols.get(m["name"], {}):
                return vols[m["name"]][kind], posixpath.relpath(path, mp)
    return None, None
config_path = value("--config")
secrets = set()
for who, pod in [("launcher", launcher)] + [(f"StatefulSet {n}", p) for n, p in pods.items()]:
    source, key = mounted(pod, config_path or "", "configMap")
    if source is None or source.get("name") != cm["metadata"]["name"] or key not in cm["data"]:
        reject(f"{who}: --config {config_path} is not the ConfigMap {cm['metadata']['name']}'s key mounted there")
    claim = mounted(pod, rundir, "persistentVolumeClaim")[0]
    if claim is None:
        reject(f"{who}: the run directory {rundir} is on no mounted PersistentVolumeClaim")
    elif "ReadWriteMany" not in pvcs.get(claim["claimName"], {}).get("spec", {}).get("accessModes", []):
        reject(f"{who}: the run directory's claim {claim['claimName']} is no ReadWriteMany claim of these manifests")
    secret = mounted(pod, "/root/.ssh/id", "secret")[0]
    if secret is None:
        reject(f"{who}: no Secret mounted at /root/.ssh (the ssh key pair mpirun logs in with)")
    else:
        secrets.add(secret["secretName"])
    if int(pod.get("terminationGracePeriodSeconds", 30)) < 120:
        reject(f"{who}: terminationGracePeriodSeconds under 120 s leaves no time for the save on SIGTERM")
if len(secrets) > 1:
    reject(f"the pods mount different ssh Secrets: {sorted(secrets)}")
init = value("--init")
if init and mounted(launcher, init, "persistentVolumeClaim")[0] is None:
    reject(f"launcher: --init {init} is on no mounted PersistentVolumeClaim")
if int(job["spec"].get("backoffLimit", 6)) < 1:
    reject("backoffLimit < 1: a failed launcher is never retried")
print(f"CHECKED: {started} ranks on {len(hosts)} pods, {len(training)} of them on the training pool, config {config_path}")
PY
  [ -s "$dir/run/plan.txt" ] || return
  local n
  n=$(wc -l <"$dir/run/plan.txt")
  for stage in "$@"; do
    case "$stage" in
      map) pools_map "$dir" "$n" ;;
      dry) pools_dry_run "$dir" "$n" ;;
    esac
  done
}

# pools_map DIR N: mpirun's own map of the hostfile with the launcher's mpirun
# options (--do-not-launch: nothing is started, nothing is reached) must be the
# plan's launcher rank -> pod, local rank. Open MPI 5's output only.
pools_map() {
  local dir=$1 n=$2 args=()
  if ! open_mpi_5; then
    echo "NOTE: the map check needs Open MPI 5's mpirun; $MPIEXEC is another"; return
  fi
  mapfile -t args <"$dir/run/mpi-args"
  [ "$(id -u)" -eq 0 ] && args+=(--allow-run-as-root)
  timeout 60 "$MPIEXEC" "${args[@]}" --oversubscribe --display map --do-not-launch -np "$n" true \
    >"$dir/run/map.txt" 2>&1 || { echo "REJECT: mpirun's map failed: $(tail -n 5 "$dir/run/map.txt")"; return; }
  "$PY" - "$dir/run" <<'PY'
import re, sys
run = sys.argv[1]
mapped, node = {}, None
for line in open(f"{run}/map.txt"):
    m = re.search(r"Data for node: (\S+)", line)
    if m:
        node = m.group(1)
    m = re.search(r"Local rank: (\d+).*App rank: (\d+)", line)
    if m and node:
        mapped[int(m.group(2))] = (node, int(m.group(1)))
plan = {int(r): (pod, int(local)) for r, pod, local, _ in (l.split() for l in open(f"{run}/plan.txt"))}
if mapped != plan:
    diff = [(r, plan.get(r), mapped.get(r)) for r in sorted(set(plan) | set(mapped)) if plan.get(r) != mapped.get(r)]
    print(f"REJECT: mpirun maps the launcher's ranks otherwise than the placement check assumed "
          f"(rank, assumed, mpirun): {diff[:4]}")
PY
}

# pools_dry_run DIR N: `moerl train --dry-run` through launch.sh, each launcher
# rank told its pod's name (MOERL_HOST_NAME, what gethostname gives in the
# pod); moerl's own placement must give every rank the role the plan says.
pools_dry_run() {
  local dir=$1 n=$2
  cat >"$dir/run/wrapper.sh" <<WRAP
#!/usr/bin/env bash
# launch.sh also runs the binary outside mpirun (--mpiexec, --version).
if [ -n "\${OMPI_COMM_WORLD_RANK:-}" ]; then
  read -r _ pod _ < <(sed -n "\$((OMPI_COMM_WORLD_RANK + 1))p" "$dir/run/plan.txt")
  echo "\$\$ \$OMPI_COMM_WORLD_RANK \$pod" >>"$dir/run/wrapper.log"
  export MOERL_HOST_NAME=\$pod
fi
exec "$MOERL" "\$@"
WRAP
  chmod +x "$dir/run/wrapper.sh"
  if ! timeout -k 10 120 env MOERL_BIN="$dir/run/wrapper.sh" "$SOURCE_DIR/scripts/launch.sh" --max-restarts 0 -n "$n" \
      train --config "$dir/run/moerl.toml" --set run.output_dir="$dir/run/runs" --dry-run >"$dir/run/dry.txt" 2>&1; then
    echo "REJECT: moerl dry run with the pods' host names failed: $(grep -v '^\[' "$dir/run/dry.txt" | head -n 3)"
    return
  fi
  "$PY" - "$dir/run" <<'PY'
import re, sys
run = sys.argv[1]
plan = {int(r): (pod, role) for r, pod, _, role in (l.split() for l in open(f"{run}/plan.txt"))}
launcher_rank = {int(pid): int(r) for pid, r, *_ in (l.split() for l in open(f"{run}/wrapper.log"))}
rows = re.findall(r"^(\d+) +(learner|actor|env_worker|standby_actor) \d+ +(\S+) +(\d+)", open(f"{run}/dry.txt").read(), re.M)
if len(rows) != len(plan):
    print(f"REJECT: the dry run lists {len(rows)} ranks, the plan {len(plan)}"); sys.exit(0)
for job_rank, role, host, pid in rows:
    r = launcher_rank.get(int(pid))
    if r is None or plan[r] != (host, role):
        print(f"REJECT: moerl placed job rank {job_rank} ({role} on {host}, launcher rank {r}) otherwise than "
              f"the plan ({plan.get(r)})")
print(f"CHECKED: moerl dry run placed {len(rows)} ranks as planned")
PY
}

cp -r "$POOLS" pools_good
pools_checks pools_good map dry >pools_good.txt
if grep -q REJECT pools_good.txt || [ "$(grep -c '^CHECKED: ' pools_good.txt)" -ne 2 ]; then
  fail "configs/k8s/pools/ is rejected (or not every check ran)"; sed 's/^/    | /' pools_good.txt
fi

# pools_broken NAME EXPECTED PYTHON [STAGES]: a copy edited by PYTHON must be
# rejected with a finding containing EXPECTED. PYTHON sees the manifests as
# dicts: train, infer, env (StatefulSets), job, svc, pvc, cm; and helpers
# launcher (the Job's container), script (its script, a string to edit and
# assign back with set_script), toml (cm's moerl.toml, assign back with set_toml).
pools_broken() {
  local name=$1 expected=$2 edit=$3
  shift 3
  rm -rf "$name" && cp -r "$POOLS" "$name"
  "$PY" - "$name" "$edit" <<'PY'
import copy, sys, yaml
d = sys.argv[1]
files = {"train": "statefulset-train.yaml", "infer": "statefulset-infer.yaml", "env": "statefulset-env.yaml",
         "job": "job-launcher.yaml", "svc": "service.yaml", "pvc": "pvc.yaml", "cm": "configmap.yaml"}
m = {k: yaml.safe_load(open(f"{d}/{f}")) for k, f in files.items()}
original = copy.deepcopy(m)
launcher = m["job"]["spec"]["template"]["spec"]["containers"][0]
script = launcher["args"][0]
def set_script(s): launcher["args"][0] = s
toml = m["cm"]["data"]["moerl.toml"]
def set_toml(s): m["cm"]["data"]["moerl.toml"] = s
def spec(k): return m[k]["spec"]["template"]["spec"]
def res(k): return spec(k)["containers"][0]["resources"]
exec(sys.argv[2], dict(m, launcher=launcher, script=script, set_script=set_script, toml=toml,
                       set_toml=set_toml, spec=spec, res=res))
# Only the edited files are written: the others keep the committed text (and
# their cached kubernetes-validate verdict).
for k, f in files.items():
    if m[k] != original[k]:
        yaml.safe_dump(m[k], open(f"{d}/{f}", "w"), sort_keys=False)
PY
  pools_checks "$name" "$@" >"$name.txt"
  grep -q "REJECT: .*$expected" "$name.txt" || { fail "$name: not rejected for '$expected'"; sed 's/^/    | /' "$name.txt"; }
}
pools_broken p_sts_field "kubernetes-validate statefulset-train" 'train["spec"]["replica"] = 2'
pools_broken p_job_type "kubernetes-validate job-launcher" 'job["spec"]["backoffLimit"] = "3"'
pools_broken p_not_headless "not headless" 'del svc["spec"]["clusterIP"]'
pools_broken p_selector "does not select StatefulSet moerl-env" 'svc["spec"]["selector"]["moerl/rank-host"] = "yes"'
pools_broken p_replicas "StatefulSet moerl-train has 3 pods" 'train["spec"]["replicas"] = 3'
pools_broken p_no_pod "which no StatefulSet creates" 'e = launcher["env"][0]; e["value"] = e["value"].replace("moerl-env:2:2", "moerl-env:3:2")'
pools_broken p_slots "cluster.ranks is 12" 'e = launcher["env"][0]; e["value"] = e["value"].replace("moerl-env:2:2", "moerl-env:2:3")'
pools_broken p_config_ranks "cluster.ranks is 13" 'set_toml(toml.replace("env_workers = 4", "env_workers = 5"))'
pools_broken p_learners "training pods have 4 slots for 2 learners" 'set_toml(toml.replace("learners = 4", "learners = 2").replace("env_workers = 4", "env_workers = 6"))'
pools_broken p_glob_wide "matches inference pod moerl-infer-0" 'set_toml(toml.replace("training_hosts = [\"moerl-train-*\"]", "training_hosts = [\"moerl-*\"]"))'
pools_broken p_glob_miss "does not match training pod moerl-train-0" 'set_toml(toml.replace("training_hosts = [\"moerl-train-*\"]", "training_hosts = [\"train-*\"]"))'
pools_broken p_placement "cluster.placement is 'rank_order'" 'set_toml("\n".join(l.replace("host_groups", "rank_order") for l in toml.splitlines() if "_hosts =" not in l))'
pools_broken p_bad_toml "moerl config check" 'set_toml(toml + "\n[optim]\nlr = \"fast\"\n")'
pools_broken p_cpu "run.device is 'cpu'" 'set_toml(toml.replace("device = \"cuda\"", "device = \"cpu\""))'
pools_broken p_no_gpu "moerl-infer-0 runs actor ranks but does not request GPUs" 'del res("infer")["requests"]["nvidia.com/gpu"]; del res("infer")["limits"]["nvidia.com/gpu"]'
pools_broken p_few_gpus "the learner at local rank 1 has no GPU of its own" 'res("train")["requests"]["nvidia.com/gpu"] = "1"; res("train")["limits"]["nvidia.com/gpu"] = "1"'
pools_broken p_order "moerl-env-0 runs actor ranks but does not request GPUs" 'e = launcher["env"][0]; e["value"] = "moerl-train:2:2 moerl-env:2:2 moerl-infer:2:2"'
pools_broken p_one_pool "share a node pool" 'spec("train")["nodeSelector"] = dict(spec("infer")["nodeSelector"])'
pools_broken p_no_config "StatefulSet moerl-env: --config" 'c = spec("env")["containers"][0]; c["volumeMounts"] = [v for v in c["volumeMounts"] if v["name"] != "config"]'
pools_broken p_no_runs "StatefulSet moerl-infer: the run directory" 'c = spec("infer")["containers"][0]; c["volumeMounts"] = [v for v in c["volumeMounts"] if v["name"] != "runs"]'
pools_broken p_rwo "no ReadWriteMany claim" 'pvc["spec"]["accessModes"] = ["ReadWriteOnce"]'
pools_broken p_init "launcher: --init" 'set_script(script.replace("--init /runs/k8s-pools/base.pt", "--init /tmp/base.pt"))'
pools_broken p_no_ssh "StatefulSet moerl-train: no Secret mounted at /root/.ssh" 'c = spec("train")["containers"][0]; c["volumeMounts"] = [v for v in c["volumeMounts"] if v["name"] != "ssh"]'
pools_broken p_grace "StatefulSet moerl-infer: terminationGracePeriodSeconds" 'spec("infer")["terminationGracePeriodSeconds"] = 30'
pools_broken p_no_resume "--resume auto" 'set_script(script.replace(" --resume auto", ""))'
pools_broken p_no_wait "goes on when a rank host never answers" 'set_script(script.replace("exit 1\n", "break\n"))'
open_mpi_5 && pools_broken p_map_by_node "mpirun maps the launcher" 'set_script(script.replace("--mpi-arg --bind-to --mpi-arg none", "--mpi-arg --bind-to --mpi-arg none --mpi-arg --map-by --mpi-arg node"))' map
pools_broken p_dry_run "moerl dry run with the pods' host names failed: .*matches neither" 'set_toml(toml.replace("inference_hosts = [\"moerl-infer-*\", \"moerl-env-*\"]", "inference_hosts = [\"moerl-infer-*\"]"))' dry

# The Dockerfile, statically (no image build offline): it reuses setup.sh and
# build.sh rather than listing packages again, and the runtime stage has what
# the pods run.
# setup.sh's packages: its build and its test lists.
SETUP_PACKAGES=$(sed -n '/^\(TEST_\)\{0,1\}PACKAGES=(/,/^)/p' "$SOURCE_DIR/scripts/setup.sh" |
                 sed 's/#.*//; s/^\(TEST_\)\{0,1\}PACKAGES=(//; s/)//')
[ "$(wc -w <<<"$SETUP_PACKAGES")" -ge 20 ] || fail "could not read setup.sh's package lists: $SETUP_PACKAGES"
DF="$SOURCE_DIR/Dockerfile"
if [ ! -f "$DF" ]; then fail "no Dockerfile at the repository root"; else
  grep -qE '^FROM debian:12( |$)' "$DF" || fail "Dockerfile: no Debian 12 base"
  grep -qE '^RUN .*scripts/setup\.sh' "$DF" || fail "Dockerfile: does not run scripts/setup.sh"
  grep -qE '^RUN .*scripts/build\.sh' "$DF" || fail "Dockerfile: does not run scripts/build.sh"
  [ "$(grep -cE '^FROM ' "$DF")" -ge 2 ] || fail "Dockerfile: no separate runtime stage"
  for path in /opt/moerl/build/moerl /opt/moerl/.mpi; do
    grep -qE "^COPY --from=build $path " "$DF" || fail "Dockerfile: the runtime stage does not copy $path"
  done
  for dir in scripts configs; do
    grep -qE "^COPY $dir/ " "$DF" || fail "Dockerfile: the runtime stage does not copy $dir/"
  done
  grep -q 'openssh-server' "$DF" || fail "Dockerfile: no sshd for the MPI operator's launcher"
  # The one package list is setup.sh's: none of its packages may be named here.
  for pkg in $SETUP_PACKAGES; do
    grep -qw -- "$pkg" "$DF" && fail "Dockerfile names setup.sh's package $pkg (keep the list in setup.sh)"
  done
  # The worker image must have sshd at the path the worker command starts.
  grep -q '/usr/sbin/sshd' "$K8S/mpijob.yaml" || fail "mpijob.yaml: the workers do not start sshd"
fi

# Dockerfile.cuda (the pools variant's image), statically: a CUDA devel base
# for nvcc, packages through setup.sh with LibTorch from the torch wheel
# (MOERL_TORCH=pip), the build through build.sh with the CUDA kernels on and
# the CMake arguments setup.sh wrote, a runtime stage on the same CUDA.
# cuda_dockerfile_checks FILE: one "REJECT: ..." line per finding.
cuda_dockerfile_checks() {
  local df=$1 joined cuda path dir pkg
  # One line per instruction (continuation lines joined).
  joined=$(sed -e ':a' -e '/\\$/N; s/\\\n//; ta' "$df")
  cuda=$(sed -nE 's/^FROM nvidia\/cuda:([0-9][0-9.]*)-(cudnn-)?devel-ubuntu[0-9.]+ AS build$/\1/p' <<<"$joined")
  [ -n "$cuda" ] || echo "REJECT: the build stage is not FROM nvidia/cuda:VERSION-devel-ubuntu... AS build"
  grep -qE "^FROM nvidia/cuda:${cuda:-none}-(cudnn-)?runtime-ubuntu[0-9.]+ AS runtime\$" <<<"$joined" ||
    echo "REJECT: the runtime stage is not FROM nvidia/cuda:${cuda:-?}-runtime-... (the build's CUDA)"
  grep -qE '^RUN .*MOERL_TORCH=pip .*scripts/setup\.sh' <<<"$joined" ||
    echo "REJECT: does not run scripts/setup.sh with MOERL_TORCH=pip"
  grep -E '^RUN .*scripts/build\.sh' <<<"$joined" | grep -q 'cat \.torch/cmake_args.*-DMOERL_CUDA=ON' ||
    echo "REJECT: does not run scripts/build.sh with setup.sh's .torch/cmake_args and -DMOERL_CUDA=ON"
  for path in /opt/moerl/build/moerl /opt/moerl/.mpi /opt/moerl/.torch; do
    grep -qE "^COPY --from=build $path " <<<"$joined" || echo "REJECT: the runtime stage does not copy $path"
  done
  for dir in scripts configs; do
    grep -qE "^COPY $dir/ " <<<"$joined" || echo "REJECT: the runtime stage does not copy $dir/"
  done
  grep -qE '^RUN .*apt-get install .*openssh-server' <<<"$joined" || echo "REJECT: no sshd for the launcher's mpirun (openssh-server)"
  for pkg in $SETUP_PACKAGES; do
    grep -qw -- "$pkg" "$df" && echo "REJECT: names setup.sh's package $pkg (keep the list in setup.sh)"
  done
  return 0
}
DFC="$SOURCE_DIR/Dockerfile.cuda"
if [ ! -f "$DFC" ]; then fail "no Dockerfile.cuda at the repository root"; else
  cuda_dockerfile_checks "$DFC" >dockerfile-cuda.txt
  [ -s dockerfile-cuda.txt ] && { fail "Dockerfile.cuda is rejected"; sed 's/^/    | /' dockerfile-cuda.txt; }
  # docker_broken NAME EXPECTED SED: a copy edited by SED must be rejected with EXPECTED.
  docker_broken() {
    sed "$3" "$DFC" >"$1.Dockerfile"
    cuda_dockerfile_checks "$1.Dockerfile" >"$1.txt"
    grep -q "REJECT: .*$2" "$1.txt" || { fail "$1: not rejected for '$2'"; sed 's/^/    | /' "$1.txt"; }
  }
  docker_broken d_cpu_base "build stage" 's#^FROM nvidia/cuda:[^ ]* AS build#FROM debian:12 AS build#'
  docker_broken d_runtime_cuda "runtime stage is not" 's#^FROM nvidia/cuda:[0-9.]*-runtime#FROM nvidia/cuda:12.8.1-runtime#'
  docker_broken d_debian_torch "MOERL_TORCH=pip" 's#MOERL_TORCH=pip ##'
  docker_broken d_no_cuda "scripts/build.sh with" 's#-DMOERL_CUDA=ON#-DMOERL_CUDA=OFF#'
  docker_broken d_no_torch "does not copy /opt/moerl/.torch" '/^COPY --from=build \/opt\/moerl\/.torch/d'
  docker_broken d_package "names setup.sh's package libhdf5-dev" 's#openssh-server#openssh-server libhdf5-dev#'
  docker_broken d_no_configs "does not copy configs/" '/^COPY configs\//d'
  docker_broken d_no_sshd "no sshd" 's#openssh-server ##'
  # Every pools pod runs the CUDA image; the rank hosts start sshd.
  for f in "$POOLS"/statefulset-*.yaml "$POOLS"/job-launcher.yaml; do
    grep -E '^ +image: ' "$f" | grep -qv 'image: moerl-cuda:' && fail "$(basename "$f"): an image other than moerl-cuda (Dockerfile.cuda)"
    case "$f" in *statefulset-*) grep -q '/usr/sbin/sshd' "$f" || fail "$(basename "$f"): the rank hosts do not start sshd" ;; esac
  done
fi
DI="$SOURCE_DIR/.dockerignore"
for entry in 'build*/' 'runs/' '.mpi/' '.deploy-tools/' '.torch/' '.git'; do
  grep -qxF -- "$entry" "$DI" 2>/dev/null || fail ".dockerignore lacks $entry"
done
finish
