# The Kubernetes deployment (configs/k8s/, Dockerfile), checked offline:
# built-in kinds and the MPIJob's pod templates against Kubernetes' own schemas
# (kubernetes-validate, strict), the MPIJob against configs/k8s/schema/
# (check-jsonschema), and the facts moerl needs: a valid embedded config, as many
# ranks started as the config has, every path the command uses mounted. Broken
# copies must be rejected, so that each check is shown able to fail.
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
  out=$("$MOERL" config check "$toml" 2>&1) || { echo "REJECT: moerl config check: $out"; return; }
  local ranks rundir
  ranks=$("$MOERL" config get "$toml" cluster.ranks 2>&1) || { echo "REJECT: moerl config get cluster.ranks: $ranks"; return; }
  rundir=$("$MOERL" config get "$toml" run.directory 2>&1) || { echo "REJECT: moerl config get run.directory: $rundir"; return; }
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

# The Dockerfile, statically (no image build offline): it reuses setup.sh and
# build.sh rather than listing packages again, and the runtime stage has what
# the pods run.
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
  for pkg in $(sed -n '/^PACKAGES=(/,/^)/p' "$SOURCE_DIR/scripts/setup.sh" | sed 's/#.*//; s/PACKAGES=(//; s/)//'); do
    grep -qw -- "$pkg" "$DF" && fail "Dockerfile names setup.sh's package $pkg (keep the list in setup.sh)"
  done
  # The worker image must have sshd at the path the worker command starts.
  grep -q '/usr/sbin/sshd' "$K8S/mpijob.yaml" || fail "mpijob.yaml: the workers do not start sshd"
fi
DI="$SOURCE_DIR/.dockerignore"
for entry in 'build*/' 'runs/' '.mpi/' '.deploy-tools/' '.git'; do
  grep -qxF -- "$entry" "$DI" 2>/dev/null || fail ".dockerignore lacks $entry"
done
finish
