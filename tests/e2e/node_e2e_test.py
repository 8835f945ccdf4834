#!/usr/bin/env python3
"""The whole user path on a real node: our images in real pods.

A single-node cluster (tests/support/kube-node: etcd, kube-apiserver, controller-manager,
scheduler, containerd + runc, kubelet, kube-proxy in a network namespace of its own) runs the
images scripts/build-images made. The ctest fixture (tests/e2e/node_fixture) builds the images,
starts the node and imports them; this test then walks what a user does:

 1. `helm install` the chart with the local images: two operator replicas, one the leader, both
    Ready; the webhook registered with the chart's certificate.
 2. A namespace labelled clusterprof.io/inject=true and a Deployment of 3 example workloads with
    nothing of clusterprof in it: the pods start with the injected sidecar (a regular container
    on 1.20) and the shared memory volume.
 3. `kubectl apply` of a ProfileJob onto a gs:// logdir (a GCS test server inside the node's
    namespace): Succeeded 3/3, three XSpaces with the workload's annotations and step numbers
    and a Task Environment plane, the skew in status. Then a Deployment of 30 injected pods
    (requests small enough for two cores) and one ProfileJob over all of them: Succeeded 30/30.
 4. A ProfileSchedule firing every minute makes two runs.
 5. The leader's pod deleted mid-capture: the other replica resumes, Succeeded, one capture per
    sidecar.
 6. A workload pod deleted mid-capture: PartiallySucceeded, naming the pod.
 7. Security: non-root, read-only root filesystems and no capabilities in the real containers;
    403 for a call outside the operator's ClusterRole with its own token; a Profile call
    without the sidecar token refused.
 8. Bad input: an image missing on the node; a logdir the sidecars may not write.
 9. A ProfileTrigger over a StatefulSet of four ranks in lockstep, one of which degrades mid-run:
    it fires once, on the straggler rule, naming that rank; its ProfileJob Succeeds with a trace
    that reaches back to the onset and a report that names the rank; nothing more fires within
    the cooldown.
 9. A broken sidecar beside a healthy workload: its token Secret missing in the namespace (the
    pod starts, the sidecar serves once the Secret is created), a sidecar that exits at every
    start, its image missing on the node; each time the trainer runs and is never restarted,
    the pod is Ready (but where Kubernetes counts the missing image), a ProfileJob names it.
10. `helm uninstall`: everything of ours gone but the CRDs; the workloads keep running.

It also measures the figures of bench/RESULTS.md ("Real node issue") and writes them to
$CLUSTERPROF_E2E_FIGURES (JSON), and leaves the cluster's objects, events and container logs in
build/e2e/diagnostics/ for the reader of a failed run. Exit 77 (skipped) when the fixture did
not start a node.
"""

import base64
import binascii
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

SKIP_CODE = 77
SOURCE_DIR = os.environ.get(
    "CLUSTERPROF_SOURCE_DIR",
    os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
BINARY_DIR = os.environ.get("CLUSTERPROF_BINARY_DIR", os.path.join(SOURCE_DIR, "build"))
NODE_DIR = os.environ.get("CLUSTERPROF_NODE_DIR", os.path.join(BINARY_DIR, "e2e", "node"))
FIGURES = os.environ.get("CLUSTERPROF_E2E_FIGURES",
                         os.path.join(BINARY_DIR, "e2e", "figures.json"))
KUBE_NODE = os.path.join(SOURCE_DIR, "tests", "support", "kube-node")
CHART = os.path.join(SOURCE_DIR, "helm", "clusterprof")

RELEASE = "clusterprof"
SYSTEM_NS = "clusterprof-system"
NS = "training"
BUCKET = "e2e"
LOGDIR = "gs://%s/tb" % BUCKET
VERSION = re.search(r'^appVersion:\s*"?([^"\n]+)"?', open(
    os.path.join(CHART, "Chart.yaml")).read(), re.M).group(1)
OPERATOR_IMAGE = "localhost/clusterprof/operator"  # as in tests/e2e/local-node-values.yaml
WORKLOAD_IMAGE = "localhost/clusterprof/example-workload:%s" % VERSION

figures = {}


def log(message):
    sys.stderr.write("node_e2e: %s\n" % message)
    sys.stderr.flush()


def read_env(path):
    env = {}
    with open(path) as f:
        for line in f:
            key, _, value = line.strip().partition("=")
            env[key] = value.strip("'\"")
    return env


def find_helm():
    if os.environ.get("CLUSTERPROF_HELM"):
        return os.environ["CLUSTERPROF_HELM"]
    cache = os.environ.get("CLUSTERPROF_HELM_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "clusterprof")
    found = sorted(glob.glob(os.path.join(cache, "helm-*", "helm")))
    return found[-1] if found else shutil.which("helm")


def run(argv, check=True, input=None, timeout=120):
    result = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError("%s failed (%d):\n%s%s" % (" ".join(argv), result.returncode,
                                                         result.stdout, result.stderr))
    return result


def kubectl(*args, check=True, input=None, timeout=120):
    return run(["kubectl"] + list(args), check=check, input=input, timeout=timeout)


def kjson(*args):
    return json.loads(kubectl(*(list(args) + ["-o", "json"])).stdout)


def apply(manifest, namespace=None):
    args = ["apply", "-f", "-"] + (["-n", namespace] if namespace else [])
    kubectl(*args, input=manifest)


def wait_until(what, predicate, timeout=120, interval=0.2):
    """Polls predicate() until it returns something true; returns it. Fails after timeout."""
    deadline = time.monotonic() + timeout
    last_error = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except (AssertionError, subprocess.SubprocessError, KeyError, ValueError) as e:
            last_error = e
        time.sleep(interval)
    raise AssertionError("timed out after %ds waiting for %s%s" % (
        timeout, what, "; last error: %s" % last_error if last_error else ""))


def pods(namespace, selector):
    return kjson("get", "pods", "-n", namespace, "-l", selector)["items"]


def ready(pod):
    return pod.get("status", {}).get("phase") == "Running" and any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in pod["status"].get("conditions", []))


def pod_events(namespace, name):
    items = kjson("get", "events", "-n", namespace, "--field-selector",
                  "involvedObject.name=%s" % name)["items"]
    return ["%s %s: %s" % (e.get("type"), e.get("reason"), e.get("message")) for e in items]


def job(name, namespace=NS):
    return kjson("get", "profilejob", name, "-n", namespace)


def wait_job_done(name, timeout=120, namespace=NS):
    def done():
        j = job(name, namespace)
        return j if j.get("status", {}).get("phase") in (
            "Succeeded", "PartiallySucceeded", "Failed") else None
    return wait_until("ProfileJob %s to finish" % name, done, timeout=timeout, interval=0.05)


def trainer_deployment(name, app, replicas, busy_percent, step_ms, requests, grace_s=1,
                       annotations=""):
    """A Deployment of `replicas` train_loop pods labelled app=<app> (injected with a sidecar in
    NS); `requests` and `annotations` are YAML flow mappings ("{cpu: 10m}")."""
    return """
apiVersion: apps/v1
kind: Deployment
metadata: {name: %s}
spec:
  replicas: %d
  selector: {matchLabels: {app: %s}}
  template:
    metadata: {labels: {app: %s}%s}
    spec:
      terminationGracePeriodSeconds: %d
      containers:
      - name: trainer
        image: %s
        imagePullPolicy: Never
        args: ["/usr/bin/train_loop", "--busy-percent", "%d", "--step-ms", "%d"]
        resources: {requests: %s}
""" % (name, replicas, app, app, ", annotations: %s" % annotations if annotations else "",
       grace_s, WORKLOAD_IMAGE, busy_percent, step_ms, requests)


def wait_pods_ready(app, count, timeout=180, interval=0.2):
    """The pods labelled app=<app>, once `count` of them are Ready."""
    return wait_until("%d %s pods Ready" % (count, app),
                      lambda: len([p for p in pods(NS, "app=" + app) if ready(p)]) == count
                      and pods(NS, "app=" + app), timeout=timeout, interval=interval)


def remove_deployment(name, app):
    """Deletes a Deployment and waits until its pods are gone (the next steps run on a quiet
    node)."""
    kubectl("delete", "deployment", name, "-n", NS, "--wait=false", check=False)
    wait_until("%s pods gone" % app, lambda: not pods(NS, "app=" + app), timeout=180, interval=1)


def profile_job(name, duration_ms=2000, delay_ms=1000, logdir=LOGDIR, selector="e2e-trainer",
                extra=""):
    return """
apiVersion: clusterprof.io/v1alpha1
kind: ProfileJob
metadata: {name: %s}
spec:
  targets:
    selector: {matchLabels: {app: %s}}
  durationMs: %d
  delayMs: %d
  logdir: %s
  options: {hostTracerLevel: 2, deviceTracerLevel: 0}
%s""" % (name, selector, duration_ms, delay_ms, logdir, extra)


def operator_pods():
    return pods(SYSTEM_NS, "app.kubernetes.io/instance=%s,app.kubernetes.io/component=operator"
                % RELEASE)


def leader():
    """The pod holding the operator's Lease (its identity is <hostname>_<pid>), or ""."""
    lease = kjson("get", "lease", "clusterprof-operator", "-n", SYSTEM_NS)
    return lease["spec"].get("holderIdentity", "").rpartition("_")[0]


def start_gcs_test_server(work, node_ip):
    """The GCS test server inside the node's network namespace, where pods reach it, serving
    BUCKET: (its process, its log file, host:port)."""
    port_file = os.path.join(work, "gcs.port")
    log_file = open(os.path.join(work, "gcs.log"), "w")
    process = subprocess.Popen(
        [KUBE_NODE, "exec", NODE_DIR, "--",
         os.path.join(BINARY_DIR, "tests", "gcs-test-server"), "--address", node_ip,
         "--port", "0", "--port-file", port_file, "--bucket", BUCKET],
        stdout=subprocess.DEVNULL, stderr=log_file)
    wait_until("the GCS test server", lambda: os.path.exists(port_file), timeout=20)
    with open(port_file) as f:
        return process, log_file, "%s:%s" % (node_ip, f.read().strip())


def stop_gcs_test_server(process, log_file):
    process.terminate()
    process.wait(10)
    log_file.close()


def container_id(pod, container):
    for status in pod["status"].get("containerStatuses", []):
        if status["name"] == container and status.get("containerID"):
            return status["containerID"].split("://", 1)[1]
    return None


def container_memory(pod, container):
    """(cgroup bytes, RSS bytes) of a container, read on the node: its memory cgroup's
    memory.usage_in_bytes (cgroup v1; what its limit and the kubelet count: pages it touched
    first, shared libraries mostly not) and the VmRSS of its processes (shared pages included)."""
    cid = container_id(pod, container)
    node_state = read_env(os.path.join(NODE_DIR, "state"))
    root = node_state["cgroup_root"].lstrip("/")
    found = glob.glob("/sys/fs/cgroup/memory/%s/kubepods/**/%s" % (root, cid), recursive=True)
    if not found:
        return None, None
    with open(os.path.join(found[0], "memory.usage_in_bytes")) as f:
        usage = int(f.read())
    rss = 0
    with open(os.path.join(found[0], "cgroup.procs")) as f:
        for pid in f.read().split():
            try:
                with open("/proc/%s/status" % pid) as status:
                    for line in status:
                        if line.startswith("VmRSS:"):
                            rss += int(line.split()[1]) * 1024
            except OSError:
                pass
    return usage, rss


class NodeE2E(unittest.TestCase):
    """The steps share the cluster and run in the order of their names."""

    gcs = None

    @classmethod
    def setUpClass(cls):
        env = read_env(os.path.join(NODE_DIR, "env"))
        os.environ["KUBECONFIG"] = env["KUBECONFIG"]
        cls.node_ip = env["CLUSTERPROF_NODE_IP"]
        cls.node_name = env["CLUSTERPROF_NODE_NAME"]
        cls.helm = find_helm()
        if not cls.helm:
            raise unittest.SkipTest("no helm: run scripts/install-helm")
        cls.work = tempfile.mkdtemp(prefix="node-e2e-")
        shutil.rmtree(os.path.join(os.path.dirname(FIGURES), "diagnostics"), ignore_errors=True)
        # The GCS test server inside the node's network namespace, where pods reach it.
        cls.gcs, cls.gcs_log, cls.gcs_host = start_gcs_test_server(cls.work, cls.node_ip)

    @classmethod
    def tearDownClass(cls):
        cls.save_diagnostics()
        if cls.gcs:
            stop_gcs_test_server(cls.gcs, cls.gcs_log)
        with open(FIGURES, "w") as f:
            json.dump(figures, f, indent=2, sort_keys=True)
        log("figures (%s): %s" % (FIGURES, json.dumps(figures, sort_keys=True)))
        shutil.rmtree(cls.work, ignore_errors=True)

    @classmethod
    def save_diagnostics(cls):
        """What a reader of a failed run needs once the node is gone: the objects, the events
        and every container's log, under build/e2e/diagnostics/."""
        out = os.path.join(os.path.dirname(FIGURES), "diagnostics")
        os.makedirs(out, exist_ok=True)
        for name, args in (("objects.txt", ["get",
                                            "all,profilejobs,profileschedules,profiletriggers,"
                                            "leases",
                                            "-A", "-o", "wide"]),
                           ("events.txt", ["get", "events", "-A", "--sort-by",
                                           ".lastTimestamp"])):
            with open(os.path.join(out, name), "w") as f:
                f.write(kubectl(*args, check=False).stdout)
        try:
            every_pod = kjson("get", "pods", "-A")["items"]
        except AssertionError:
            return
        for pod in every_pod:
            namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
            for container in pod["spec"]["containers"]:
                logs = kubectl("logs", name, "-n", namespace, "-c", container["name"],
                               check=False)
                with open(os.path.join(out, "%s_%s_%s.log" % (
                        namespace, name, container["name"])), "w") as f:
                    f.write(logs.stdout + logs.stderr)
            # A container that restarted: what it said before (a crash's last words).
            for status in pod.get("status", {}).get("containerStatuses", []):
                if status.get("restartCount", 0) == 0:
                    continue
                previous = kubectl("logs", name, "-n", namespace, "-c", status["name"],
                                   "--previous", check=False)
                with open(os.path.join(out, "%s_%s_%s.previous.log" % (
                        namespace, name, status["name"])), "w") as f:
                    f.write(json.dumps(status.get("lastState", {})) + "\n" +
                            previous.stdout + previous.stderr)

    def in_node(self, *argv, check=True, timeout=60):
        return run([KUBE_NODE, "exec", NODE_DIR, "--", "env",
                    "STORAGE_EMULATOR_HOST=%s" % self.gcs_host] + list(argv),
                   check=check, timeout=timeout)

    def cli(self, *args, check=True):
        return self.in_node(os.path.join(BINARY_DIR, "cli", "clusterprof"), *args,
                            check=check)

    # --- 1. helm install ---------------------------------------------------------------------

    def test_01_helm_install(self):
        # The workload namespace first: the chart renders the sidecar token Secret into it.
        kubectl("create", "namespace", NS)
        kubectl("label", "namespace", NS, "clusterprof.io/inject=true")
        start = time.monotonic()
        run([self.helm, "install", RELEASE, CHART, "-n", SYSTEM_NS, "--create-namespace",
             "-f", os.path.join(SOURCE_DIR, "tests", "e2e", "local-node-values.yaml"),
             "--set", "sidecar.allowedLogdirs={%s}" % LOGDIR,
             "--set", "sidecar.extraEnv.STORAGE_EMULATOR_HOST=%s" % self.gcs_host,
             "--set", "operator.extraEnv[0].name=STORAGE_EMULATOR_HOST",
             "--set", "operator.extraEnv[0].value=%s" % self.gcs_host,
             "--set", "auth.namespaces={%s}" % NS], timeout=120)
        both = wait_until("two operator replicas Ready",
                          lambda: len([p for p in operator_pods() if ready(p)]) == 2 and
                          operator_pods(), timeout=180)
        figures["helm_install_to_operator_ready_s"] = round(time.monotonic() - start, 1)
        names = {p["metadata"]["name"] for p in both}
        holder = wait_until("a leader", lambda: leader() in names and leader(), timeout=60)
        log("operator replicas %s, leader %s" % (sorted(names), holder))

        # The webhook, registered with the chart's certificate.
        hooks = kjson("get", "mutatingwebhookconfigurations")["items"]
        ours = [h for h in hooks if h["metadata"]["name"].startswith(RELEASE)]
        self.assertEqual(len(ours), 1, [h["metadata"]["name"] for h in hooks])
        for hook in ours[0]["webhooks"]:
            self.assertTrue(hook["clientConfig"].get("caBundle"), hook["name"])

    # --- 2. injected workloads ---------------------------------------------------------------

    def test_02_injected_deployment(self):
        wait_until("serviceaccount/default in %s" % NS,
                   lambda: kubectl("get", "serviceaccount", "default", "-n", NS).returncode == 0)
        apply(trainer_deployment("trainer", "e2e-trainer", 3, busy_percent=5, step_ms=50,
                                 requests="{cpu: 10m}", grace_s=5), NS)
        running = wait_pods_ready("e2e-trainer", 3)
        for pod in running:
            name = pod["metadata"]["name"]
            containers = [c["name"] for c in pod["spec"]["containers"]]
            # Kubernetes 1.20 has no native sidecars: the operator injects a regular container.
            self.assertEqual(containers, ["trainer", "clusterprof-sidecar"], name)
            self.assertNotIn("initContainers", pod["spec"], name)
            self.assertEqual(pod["metadata"]["labels"].get("clusterprof.io/injected"), "true")
            volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
            self.assertEqual(volumes["clusterprof-shm"]["emptyDir"].get("medium"), "Memory")
            for c in pod["spec"]["containers"]:
                self.assertIn("/var/run/clusterprof",
                              [m["mountPath"] for m in c.get("volumeMounts", [])], c["name"])
            statuses = {s["name"]: s for s in pod["status"]["containerStatuses"]}
            self.assertTrue(statuses["clusterprof-sidecar"]["ready"], name)
            self.assertEqual(statuses["clusterprof-sidecar"]["restartCount"], 0, name)
        # One volume across the containers: the trainer container sees the control page the
        # sidecar container created (the rings go the other way, checked after the capture).
        first = running[0]["metadata"]["name"]
        listing = kubectl("exec", "-n", NS, first, "-c", "trainer", "--", "ls", "-l",
                          "/var/run/clusterprof").stdout
        self.assertRegex(listing, r"65532 +65532 .* control\n", listing)

    def test_03_pod_start_with_and_without_the_sidecar(self):
        # The same pod in the injected namespace and in one that is not, one at a time.
        kubectl("create", "namespace", "plain", check=False)
        wait_until("serviceaccount/default in plain",
                   lambda: kubectl("get", "serviceaccount", "default", "-n", "plain")
                   .returncode == 0)
        samples = {"with": [], "without": []}
        for i in range(5):
            for kind, namespace in (("without", "plain"), ("with", NS)):
                name = "start-%s-%d" % (kind, i)
                start = time.monotonic()
                apply("""
apiVersion: v1
kind: Pod
metadata: {name: %s, labels: {app: start-probe}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - {name: trainer, image: %s, imagePullPolicy: Never,
     args: ["/usr/bin/train_loop", "--busy-percent", "1"]}
""" % (name, WORKLOAD_IMAGE), namespace)
                wait_until("pod %s Ready" % name,
                           lambda: ready(kjson("get", "pod", name, "-n", namespace)),
                           timeout=60, interval=0.05)
                samples[kind].append(time.monotonic() - start)
                kubectl("delete", "pod", name, "-n", namespace, "--wait=false")
        median = {k: sorted(v)[len(v) // 2] for k, v in samples.items()}
        figures["pod_ready_without_sidecar_s"] = round(median["without"], 2)
        figures["pod_ready_with_sidecar_s"] = round(median["with"], 2)
        figures["pod_ready_samples_s"] = {k: [round(x, 2) for x in v] for k, v in samples.items()}
        log("pod Ready after create, median of 5: %.2f s without the sidecar, %.2f s with it"
            % (median["without"], median["with"]))

    # --- 3. a ProfileJob ---------------------------------------------------------------------

    def test_04_profilejob_captures_every_pod(self):
        trainers = pods(NS, "app=e2e-trainer")
        sidecar_pod = trainers[0]
        idle = container_memory(sidecar_pod, "clusterprof-sidecar")
        self.assertIsNotNone(idle[0], "no memory cgroup for the sidecar container")
        figures["sidecar_cgroup_memory_idle_bytes"], figures["sidecar_rss_idle_bytes"] = idle
        start = time.monotonic()
        apply(profile_job("e2e-capture"), NS)
        # The sidecar's memory during the capture (its window starts after delayMs).
        peak = (0, 0)
        while time.monotonic() - start < 3.5:
            usage = container_memory(sidecar_pod, "clusterprof-sidecar")
            peak = (max(peak[0], usage[0] or 0), max(peak[1], usage[1] or 0))
            time.sleep(0.1)
        done = wait_job_done("e2e-capture")
        figures["profilejob_apply_to_succeeded_s"] = round(time.monotonic() - start, 2)
        (figures["sidecar_cgroup_memory_capture_peak_bytes"],
         figures["sidecar_rss_capture_peak_bytes"]) = peak
        status = done["status"]
        self.assertEqual(status["phase"], "Succeeded", json.dumps(status, indent=1))
        self.assertEqual(status["summary"]["succeeded"], 3)
        self.assertEqual(status["summary"]["targets"], 3)
        self.assertIn("maxStartSkewNs", status["summary"])
        self.assertTrue(status["summary"].get("maxStartSkew"))
        figures["profilejob_max_start_skew"] = status["summary"]["maxStartSkew"]
        names = sorted(p["metadata"]["name"] for p in trainers)
        self.assertEqual(sorted(t["name"] for t in status["targets"]), names)
        for target in status["targets"]:
            self.assertEqual(target["node"], self.node_name)
            self.assertGreater(target["events"], 0, target)
        # The trainer's ring, which it created in the shared volume when the capture armed
        # annotations, seen by the sidecar container.
        listing = kubectl("exec", "-n", NS, sidecar_pod["metadata"]["name"], "-c",
                          "clusterprof-sidecar", "--", "ls", "/var/run/clusterprof").stdout
        self.assertRegex(listing, r"ring-\d+-\d+\.shm", listing)
        run_dir = "%s/plugins/profile/%s" % (LOGDIR, status["runName"])
        table = self.cli("inspect", "--brief", run_dir).stdout
        for name in names:
            self.assertIn(name, table)
            host_file = "%s/%s.xplane.pb" % (run_dir, name)
            detail = self.cli("inspect", "--top", "20", host_file).stdout
            self.assertIn("Task Environment", detail, detail)
            trace = json.loads(self.cli("convert", host_file, "-o", "-").stdout)
            events = trace["traceEvents"] if isinstance(trace, dict) else trace
            seen = {e.get("name") for e in events}
            for annotation in ("train", "forward", "backward", "optimizer", "allreduce"):
                self.assertIn(annotation, seen, "%s has no %s annotation" % (name, annotation))
            steps = {int(e["args"]["step_num"]) for e in events
                     if e.get("name") == "train" and "step_num" in e.get("args", {})}
            self.assertGreaterEqual(len(steps), 10, "%s: step numbers %s" % (name, steps))
        log("e2e-capture: %s, skew %s, %.2f s from apply to Succeeded" % (
            status["targetsSucceeded"], status["summary"]["maxStartSkew"],
            figures["profilejob_apply_to_succeeded_s"]))

    def test_04b_one_profilejob_over_as_many_pods_as_the_node_holds(self):
        """Beyond toy sizes: 30 injected pods on this node (requests small enough to fit two
        cores), one ProfileJob over all of them, Succeeded 30/30."""
        replicas = int(os.environ.get("CLUSTERPROF_E2E_WIDE_PODS", "30"))
        apply(trainer_deployment(
            "wide", "e2e-wide", replicas, busy_percent=1, step_ms=100,
            requests="{cpu: 1m, memory: 8Mi}",
            annotations="{clusterprof.io/sidecar-cpu-request: 5m, "
                        "clusterprof.io/sidecar-memory-request: 16Mi}"), NS)
        start = time.monotonic()
        try:
            wait_pods_ready("e2e-wide", replicas, timeout=420, interval=1)
            figures["wide_pods_ready_s"] = round(time.monotonic() - start, 1)
            start = time.monotonic()
            apply(profile_job("e2e-wide", selector="e2e-wide"), NS)
            done = wait_job_done("e2e-wide", timeout=180)
            figures["wide_profilejob_apply_to_succeeded_s"] = round(time.monotonic() - start, 2)
            status = done["status"]
            self.assertEqual(status["phase"], "Succeeded", json.dumps(status, indent=1))
            self.assertEqual(status["summary"]["targets"], replicas)
            self.assertEqual(status["summary"]["succeeded"], replicas)
            self.assertEqual(len(status["targets"]), replicas, "a job this size lists every pod")
            figures["wide_pods"] = replicas
            figures["wide_max_start_skew"] = status["summary"]["maxStartSkew"]
            figures["wide_start_error_p99"] = status["summary"].get("startErrorP99", "")
            figures["wide_object_bytes"] = len(kubectl("get", "profilejob", "e2e-wide", "-n", NS,
                                                       "-o", "json").stdout)
            run_dir = "%s/plugins/profile/%s" % (LOGDIR, status["runName"])
            table = self.cli("inspect", "--brief", run_dir).stdout
            for target in status["targets"]:
                self.assertIn(target["name"], table)
                self.assertGreater(target["events"], 0, target)
            log("e2e-wide: %s pods Ready in %.1f s; %s, skew %s (p99 %s), %.2f s from apply to "
                "Succeeded, object %d bytes" % (
                    replicas, figures["wide_pods_ready_s"], status["targetsSucceeded"],
                    figures["wide_max_start_skew"], figures["wide_start_error_p99"],
                    figures["wide_profilejob_apply_to_succeeded_s"],
                    figures["wide_object_bytes"]))
        finally:
            remove_deployment("wide", "e2e-wide")

    def test_04c_start_instant_with_every_core_busy(self):
        """Two workload pods that each keep a core busy (both cores of the node): the sidecars
        wake late in the normal class (SCHED_FIFO is refused in this node's container cgroups),
        and the captures' data still starts at T0, from the flight recorder. Figures, not
        thresholds: the start error and the wake-up error of every host, from the manifest."""
        apply(trainer_deployment("busy", "e2e-busy", 2, busy_percent=100, step_ms=20,
                                 requests="{cpu: 10m}"), NS)
        try:
            wait_pods_ready("e2e-busy", 2, interval=1)
            time.sleep(3)  # the busy loops and the sidecars' recorders settle
            errors = {"start": [], "wake": []}
            for i in range(3):
                name = "e2e-busy-%d" % i
                apply(profile_job(name, duration_ms=500, delay_ms=1000, selector="e2e-busy"), NS)
                status = wait_job_done(name, timeout=120)["status"]
                self.assertEqual(status["phase"], "Succeeded", json.dumps(status, indent=1))
                manifest_object = "tb/plugins/profile/%s/clusterprof_run.json" % status["runName"]
                url = "http://%s/storage/v1/b/%s/o/%s?alt=media" % (
                    self.gcs_host, BUCKET, manifest_object.replace("/", "%2F"))
                manifest = json.loads(self.in_node(
                    "python3", "-c",
                    "import sys, urllib.request; "
                    "sys.stdout.write(urllib.request.urlopen(sys.argv[1]).read().decode())",
                    url).stdout)
                for target in manifest["targets"]:
                    self.assertEqual(target["outcome"], "ok", target)
                    errors["start"].append(abs(target.get("start_error_ns") or 0))
                    errors["wake"].append(abs(target.get("wake_error_ns") or 0))
            for kind, values in errors.items():
                values.sort()
                figures["busy_%s_error_us" % kind] = {
                    "p50": round(values[len(values) // 2] / 1000, 1),
                    "max": round(values[-1] / 1000, 1), "n": len(values)}
            log("busy node (2 pods x 1 busy core, 3 captures): start error p50/max %s us, "
                "wake-up error p50/max %s us" % (
                    "/".join(str(figures["busy_start_error_us"][k]) for k in ("p50", "max")),
                    "/".join(str(figures["busy_wake_error_us"][k]) for k in ("p50", "max"))))
        finally:
            remove_deployment("busy", "e2e-busy")

    def test_04d_a_profilejob_applied_with_its_workload(self):
        """`kubectl apply -f dir/` with a StatefulSet and a ProfileJob for its pods: the job
        waits, Pending with WaitingForTargets, until both pods are Ready, then captures both."""
        folder = tempfile.mkdtemp(prefix="clusterprof-apply-")
        with open(os.path.join(folder, "trainer.yaml"), "w") as f:
            f.write("""
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: together}
spec:
  replicas: 2
  serviceName: together
  podManagementPolicy: Parallel
  selector: {matchLabels: {app: e2e-together}}
  template:
    metadata: {labels: {app: e2e-together}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: trainer
        image: %s
        imagePullPolicy: Never
        args: ["/usr/bin/train_loop", "--busy-percent", "5", "--step-ms", "20"]
        resources: {requests: {cpu: 10m}}
""" % WORKLOAD_IMAGE)
        with open(os.path.join(folder, "profilejob.yaml"), "w") as f:
            f.write(profile_job("e2e-together", duration_ms=500, delay_ms=500,
                                selector="e2e-together").replace(
                "    selector: {matchLabels: {app: e2e-together}}",
                "    selector: {matchLabels: {app: e2e-together}}\n    minReady: 2"))
        try:
            start = time.monotonic()
            kubectl("apply", "-n", NS, "-f", folder + "/")
            waited = wait_until("e2e-together to wait for its pods", lambda: [
                c for c in (job("e2e-together") or {}).get("status", {}).get("conditions", [])
                if c["type"] == "WaitingForTargets"], timeout=60, interval=0.1)
            log("e2e-together while waiting: %s" % waited[0]["message"])
            status = wait_job_done("e2e-together", timeout=180)["status"]
            figures["apply_with_workload_to_succeeded_s"] = round(time.monotonic() - start, 2)
            self.assertEqual(status["phase"], "Succeeded", json.dumps(status, indent=1))
            self.assertEqual(status["targetsSucceeded"], "2/2")
            self.assertEqual(sorted(t["name"] for t in status["targets"]),
                             ["together-0", "together-1"])
            condition = [c for c in status["conditions"] if c["type"] == "WaitingForTargets"][0]
            self.assertEqual((condition["status"], condition["reason"]),
                             ("False", "TargetsReady"), condition)
            log("e2e-together: %s, %.2f s from apply to Succeeded (%s)" % (
                status["targetsSucceeded"], figures["apply_with_workload_to_succeeded_s"],
                condition["message"]))
        finally:
            kubectl("delete", "-n", NS, "-f", folder + "/", "--wait=false", check=False)
            wait_until("e2e-together pods gone", lambda: not pods(NS, "app=e2e-together"),
                       timeout=180, interval=1)
            shutil.rmtree(folder, ignore_errors=True)

    def test_04e_kubectl_plugin_capture_report_pull(self):
        """`kubectl clusterprof capture` of a 2 s window of the trainer pods, as a user runs it,
        then `report` and `pull`; the time from the window's end to the plugin's return is a
        figure (bench/RESULTS.md)."""
        plugin = os.path.join(BINARY_DIR, "cli", "kubectl-clusterprof")
        # Inside the node's network namespace, where the bucket is: the API server at the node's
        # address (the admin kubeconfig reaches it through a loopback port of this machine).
        with open(os.environ["KUBECONFIG"]) as f:
            inside = re.sub(r"https://127\.0\.0\.1:\d+", "https://%s:6443" % self.node_ip,
                            f.read())
        kubeconfig = os.path.join(self.work, "in-node.kubeconfig")
        with open(kubeconfig, "w") as f:
            f.write(inside)
        start = time.monotonic()
        capture = self.in_node(plugin, "capture", "-n", NS, "-l", "app=e2e-trainer",
                               "--duration", "2s", "--delay", "500ms", "--logdir", LOGDIR,
                               "--device-tracer-level", "0", "--kubeconfig", kubeconfig,
                               "--name", "e2e-plugin", timeout=120)
        returned = time.time()
        wall = time.monotonic() - start
        self.assertIn("profilejob.clusterprof.io/e2e-plugin created", capture.stdout)
        self.assertIn("profilejob/e2e-plugin: Succeeded, 3/3 target(s) captured", capture.stdout)
        status = job("e2e-plugin")["status"]
        window_end = status["startTimeNs"] / 1e9 + 2.0
        figures["plugin_capture_return_after_window_s"] = round(returned - window_end, 2)
        figures["plugin_capture_wall_s"] = round(wall, 2)
        log("kubectl clusterprof capture: returned %.2f s after the window ended (%.2f s in all)"
            % (returned - window_end, wall))
        here = tempfile.mkdtemp(prefix="plugin-pull-")
        try:
            pull = self.in_node(plugin, "pull", "e2e-plugin", "-n", NS, "-o", here,
                                "--kubeconfig", kubeconfig)
            run_dir = os.path.join(here, "plugins", "profile", status["runName"])
            self.assertIn("into " + run_dir, pull.stdout)
            for pod in pods(NS, "app=e2e-trainer"):
                path = os.path.join(run_dir, pod["metadata"]["name"] + ".xplane.pb")
                self.assertGreater(os.path.getsize(path), 0, path)
            self.assertTrue(os.path.exists(os.path.join(run_dir, "clusterprof_run.json")))
            report = self.in_node(plugin, "report", "e2e-plugin", "-n", NS, "-o",
                                  os.path.join(here, "report"), "--kubeconfig", kubeconfig)
            self.assertIn("profilejob/e2e-plugin: Succeeded", report.stdout)
            if status.get("analysis", {}).get("reportURI"):
                self.assertTrue(os.path.exists(
                    os.path.join(here, "report", "clusterprof_report.html")), report.stdout)
        finally:
            shutil.rmtree(here, ignore_errors=True)

    # --- 4. a ProfileSchedule ----------------------------------------------------------------

    def test_05_schedule_and_security(self):
        apply("""
apiVersion: clusterprof.io/v1alpha1
kind: ProfileSchedule
metadata: {name: every-minute}
spec:
  schedule: "* * * * *"
  concurrencyPolicy: Forbid
  jobTemplate:
    spec:
      targets:
        selector: {matchLabels: {app: e2e-trainer}}
      durationMs: 1000
      delayMs: 500
      logdir: %s
      options: {hostTracerLevel: 2, deviceTracerLevel: 0}
""" % LOGDIR, NS)
        try:
            # While the schedule waits for its minutes, the security checks (they capture
            # nothing).
            self.check_security()
            self.wait_for_two_scheduled_runs()
        finally:
            kubectl("delete", "profileschedule", "every-minute", "-n", NS, check=False)

    def wait_for_two_scheduled_runs(self):
        def two_runs():
            jobs = [j for j in kjson("get", "profilejobs", "-n", NS)["items"]
                    if any(o.get("kind") == "ProfileSchedule" and o.get("name") == "every-minute"
                           for o in j["metadata"].get("ownerReferences", []))]
            done = [j for j in jobs if j.get("status", {}).get("phase") == "Succeeded"]
            return done if len(done) >= 2 else None
        runs = wait_until("two scheduled runs", two_runs, timeout=200, interval=1)
        self.assertEqual(len({j["status"]["runName"] for j in runs}), len(runs))
        for j in runs:
            kubectl("delete", "profilejob", j["metadata"]["name"], "-n", NS, "--wait=false")

    def check_security(self):
        # Non-root, read-only root filesystem, no capabilities: in the running containers.
        trainer = pods(NS, "app=e2e-trainer")[0]["metadata"]["name"]
        operator = operator_pods()[0]["metadata"]["name"]
        for namespace, pod, container in ((NS, trainer, "clusterprof-sidecar"),
                                          (SYSTEM_NS, operator, "operator")):
            def sh(script):
                return kubectl("exec", "-n", namespace, pod, "-c", container, "--", "/bin/sh",
                               "-c", script, check=False)
            self.assertEqual(sh("id -u").stdout.strip(), "65532", container)
            touch = sh("touch /probe")
            self.assertNotEqual(touch.returncode, 0, container)
            self.assertIn("Read-only file system", touch.stderr, container)
            caps = sh("grep -E '^Cap(Eff|Prm|Bnd):' /proc/self/status").stdout
            for line in caps.splitlines():
                self.assertRegex(line, r":\s+0{16}$", "%s: %s" % (container, line))
            self.assertIn("NoNewPrivs:\t1", sh("cat /proc/self/status").stdout, container)

        # The operator's own token, outside its ClusterRole: 403.
        sa = kjson("get", "pod", operator, "-n", SYSTEM_NS)["spec"]["serviceAccountName"]
        secret = kjson("get", "serviceaccount", sa, "-n", SYSTEM_NS)["secrets"][0]["name"]
        token = run(["bash", "-c", "kubectl get secret %s -n %s -o jsonpath='{.data.token}' | "
                     "base64 -d" % (secret, SYSTEM_NS)]).stdout
        # Only the token: the admin kubeconfig's client certificate would authenticate first.
        server = kubectl("config", "view", "--raw", "-o",
                         "jsonpath={.clusters[0].cluster.server}").stdout
        ca = kubectl("config", "view", "--raw", "-o",
                     "jsonpath={.clusters[0].cluster.certificate-authority}").stdout
        empty = os.path.join(self.work, "empty-kubeconfig")
        open(empty, "w").close()
        as_operator = ["--kubeconfig", empty, "--server", server, "--certificate-authority", ca,
                       "--token", token]
        allowed = kubectl(*as_operator, "get", "pods", "-n", NS, check=False)
        self.assertEqual(allowed.returncode, 0, allowed.stderr)
        refused = kubectl(*as_operator, "get", "secrets", "-n", "kube-system", check=False)
        self.assertNotEqual(refused.returncode, 0)
        self.assertIn("Forbidden", refused.stderr)
        self.assertIn("system:serviceaccount:%s:%s" % (SYSTEM_NS, sa), refused.stderr)
        refused = kubectl(*as_operator, "delete", "deployment", "trainer", "-n", NS, check=False)
        self.assertIn("Forbidden", refused.stderr)

        # A Profile call from another pod without the sidecar token: refused. In plaintext the
        # sidecar's TLS port does not even answer; over TLS (the CA is no secret: this pod
        # mounts it) the call is refused for want of the token.
        target = pods(NS, "app=e2e-trainer")[0]["status"]["podIP"]
        for name, flags, refusal in (
                ("intruder-plain", '"--insecure"', r"(?i)unavailable|socket closed|handshake"),
                ("intruder-tls", '"--tls-ca", "/ca/ca.crt"', r"(?i)unauthenticated.*bearer token")):
            apply("""
apiVersion: v1
kind: Pod
metadata: {name: %s, labels: {clusterprof.io/inject: "false"}}
spec:
  restartPolicy: Never
  volumes:
  - name: ca
    secret: {secretName: clusterprof-sidecar-tls, items: [{key: ca.crt, path: ca.crt}]}
  containers:
  - name: cli
    image: %s:%s
    imagePullPolicy: Never
    volumeMounts: [{name: ca, mountPath: /ca, readOnly: true}]
    command: ["/usr/bin/clusterprof", "capture", "--service-addr", "%s:8466", %s,
              "--logdir", "%s", "--duration-ms", "500", "--num-tracing-attempts", "1"]
""" % (name, OPERATOR_IMAGE, VERSION, target, flags, LOGDIR), NS)
            phase = wait_until("the %s pod to end" % name, lambda: kjson(
                "get", "pod", name, "-n", NS)["status"].get("phase") in ("Succeeded", "Failed")
                and kjson("get", "pod", name, "-n", NS)["status"]["phase"], timeout=60)
            output = kubectl("logs", name, "-n", NS).stdout
            self.assertEqual(phase, "Failed", output)
            self.assertRegex(output, refusal, output)
            kubectl("delete", "pod", name, "-n", NS, "--wait=false")

    def test_05b_sniffed_pod_traffic_shows_no_token(self):
        # Everything on the pod network during a capture, as a node-level observer sees it: the
        # operator's calls to the sidecars are TLS, so the token is nowhere in the bytes. The
        # same capture holds a canary sent in plaintext to the same port, which shows that the
        # sniffer reads payloads (a token sent in plaintext would be found). The operator made
        # its connections, TLS handshakes included, when the pods became Ready, before the
        # sniffer started: what it sees of them is TLS records.
        tcpdump = shutil.which("tcpdump") or "/usr/bin/tcpdump"
        self.assertTrue(os.path.exists(tcpdump), "no tcpdump: scripts/install-deps installs it")
        token = base64.b64decode(kjson("get", "secret", "clusterprof-sidecar-token", "-n",
                                       NS)["data"]["token"])
        target = pods(NS, "app=e2e-trainer")[0]["status"]["podIP"]
        pcap = os.path.join(NODE_DIR, "sniff.pcap")
        if os.path.exists(pcap):
            os.remove(pcap)
        sniffer = subprocess.Popen(
            [KUBE_NODE, "exec", NODE_DIR, "--", tcpdump, "-i", "any", "-U", "-s", "0", "-w",
             pcap, "tcp", "port", "8466"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            wait_until("tcpdump to listen", lambda: os.path.exists(pcap), timeout=20)
            apply(profile_job("e2e-sniffed", duration_ms=500, delay_ms=500), NS)
            status = wait_job_done("e2e-sniffed")["status"]
            self.assertIn(status["phase"], ("Succeeded", "PartiallySucceeded"),
                          json.dumps(status, indent=1))
            canary = "canary-%d" % os.getpid()
            self.in_node("python3", "-c", (
                "import socket; s = socket.create_connection(('%s', 8466), 5); "
                "s.sendall(b'PRI * HTTP/2.0\\r\\n\\r\\nSM\\r\\n\\r\\n"
                "authorization: Bearer %s\\r\\n'); s.close()") % (target, canary))
            time.sleep(1)  # the last packets reach the file (-U writes each as it comes)
        finally:
            sniffer.terminate()
            sniffer.wait(timeout=20)
        with open(pcap, "rb") as f:
            captured = f.read()
        log("sniffed %d bytes of pod traffic on port 8466" % len(captured))
        self.assertIn(canary.encode(), captured, "the sniffer does not see payloads")
        self.assertGreaterEqual(captured.count(b"\x17\x03\x03"), 4,
                                "no TLS records in the operator's traffic")
        for method in (b"clusterprof.v1alpha1.Sidecar/", b"tensorflow.ProfilerService/"):
            self.assertNotIn(method, captured, "a call crossed the pod network in plaintext")
        self.assertNotIn(token, captured, "the sidecar token crossed the pod network readable")
        # The sidecar counted the canary's plaintext handshake.
        metrics = self.in_node("curl", "-s", "http://%s:8467/metrics" % target).stdout
        self.assertRegex(metrics, r"clusterprof_sidecar_handshake_failures_total\{[^}]*\} [1-9]")

    def test_05b2_port_forward_reaches_the_plaintext_loopback_listener(self):
        # kubectl port-forward arrives on the pod's loopback, where the sidecar also serves
        # plaintext (XProf's capture button and jax.collect_profile speak nothing else); the
        # token is still required there unless the chart's auth.allowPortForward says otherwise.
        pod = pods(NS, "app=e2e-trainer")[0]["metadata"]["name"]
        token_file = os.path.join(NODE_DIR, "port-forward.token")
        with open(token_file, "wb") as f:
            f.write(base64.b64decode(kjson("get", "secret", "clusterprof-sidecar-token", "-n",
                                           NS)["data"]["token"]))
        forward = subprocess.Popen(["kubectl", "port-forward", "-n", NS, "pod/" + pod, ":8466"],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            line = forward.stdout.readline()
            port = re.search(r"127\.0\.0\.1:(\d+)", line)
            self.assertIsNotNone(port, line + forward.stderr.read() if not line else line)
            address = "127.0.0.1:%s" % port.group(1)
            top = os.path.join(BINARY_DIR, "cli", "clusterprof")
            shown = run([top, "top", "--service-addr", address, "--token-file", token_file,
                         "--once", "--timeout-ms", "5000"], check=False, timeout=60)
            self.assertIn(pod, shown.stdout + shown.stderr, shown.stdout + shown.stderr)
            self.assertNotRegex(shown.stdout + shown.stderr, r"(?i)unauthenticated")
            refused = run([top, "top", "--service-addr", address, "--once", "--timeout-ms",
                           "3000"], check=False, timeout=60)
            self.assertRegex(refused.stdout + refused.stderr, r"(?i)bearer token",
                             refused.stdout + refused.stderr)
        finally:
            forward.terminate()
            forward.wait(timeout=20)
            os.remove(token_file)

    def test_05c_helm_upgrade_rotates_the_token_and_certificate_without_restarts(self):
        def restarts():
            return {p["metadata"]["name"]: (p["metadata"]["uid"], sum(
                c.get("restartCount", 0) for c in p["status"].get("containerStatuses", []) +
                p["status"].get("initContainerStatuses", [])))
                for p in pods(NS, "app=e2e-trainer") + operator_pods()}

        before = restarts()
        old_token = base64.b64decode(kjson("get", "secret", "clusterprof-sidecar-token", "-n",
                                           NS)["data"]["token"])
        old_cert = kjson("get", "secret", "clusterprof-sidecar-tls", "-n", NS)["data"]["tls.crt"]
        new_token = "rotated-%s" % binascii.hexlify(os.urandom(16)).decode()
        run([self.helm, "upgrade", RELEASE, CHART, "-n", SYSTEM_NS, "--reuse-values",
             "--set", "auth.token=%s" % new_token, "--set", "sidecar.tls.renew=true"],
            timeout=120)
        self.assertEqual(base64.b64decode(kjson("get", "secret", "clusterprof-sidecar-token",
                                                "-n", NS)["data"]["token"]).decode(), new_token)
        self.assertNotEqual(kjson("get", "secret", "clusterprof-sidecar-tls", "-n",
                                  NS)["data"]["tls.crt"], old_cert)
        target = pods(NS, "app=e2e-trainer")[0]
        # The kubelet projects the new Secrets into the running pods; the sidecars and the
        # operator reread them.
        wait_until("a sidecar to take the new token", lambda: "reason" not in self.in_node(
            "curl", "-s", "http://%s:8467/metrics" % target["status"]["podIP"]).stdout or
            'file="token",result="ok"' in self.in_node(
                "curl", "-s", "http://%s:8467/metrics" % target["status"]["podIP"]).stdout,
            timeout=180, interval=2)
        wait_until("the sidecar to serve the renewed certificate", lambda: "the serving "
                   "certificate changed" in kubectl("logs", target["metadata"]["name"], "-n", NS,
                                                    "-c", "clusterprof-sidecar").stdout,
                   timeout=180, interval=2)
        apply(profile_job("e2e-rotated", duration_ms=500, delay_ms=500), NS)
        status = wait_job_done("e2e-rotated")["status"]
        self.assertEqual(status["phase"], "Succeeded", json.dumps(status, indent=1))
        self.assertEqual(restarts(), before, "a pod restarted or was replaced by the rotation")
        self.assertNotEqual(old_token.decode(), new_token)

    # --- 5. the leader dies mid-capture ------------------------------------------------------

    def test_06_leader_deleted_mid_capture(self):
        old_leader = leader()
        apply(profile_job("e2e-failover", duration_ms=6000, delay_ms=1000), NS)
        wait_until("e2e-failover capturing", lambda: job("e2e-failover").get("status", {})
                   .get("phase") == "Capturing", timeout=30, interval=0.05)
        kubectl("delete", "pod", old_leader, "-n", SYSTEM_NS, "--wait=false")
        new_leader = wait_until("a new leader", lambda: leader() not in ("", old_leader) and
                                leader(), timeout=90)
        done = wait_job_done("e2e-failover", timeout=120)
        self.assertEqual(done["status"]["phase"], "Succeeded",
                         json.dumps(done["status"], indent=1))
        self.assertEqual(done["status"]["summary"]["succeeded"], 3)
        run_name = done["status"]["runName"]
        # Each sidecar captured the run once: one "capturing" line per session in its log.
        for pod in pods(NS, "app=e2e-trainer"):
            name = pod["metadata"]["name"]
            text = kubectl("logs", name, "-n", NS, "-c", "clusterprof-sidecar").stdout
            starts = [l for l in text.splitlines()
                      if ("session %s: capturing" % run_name) in l]
            self.assertEqual(len(starts), 1, "%s captured %s %d times" % (name, run_name,
                                                                          len(starts)))
        log("leader %s deleted mid-capture; %s resumed; %s Succeeded" % (
            old_leader, new_leader, run_name))
        wait_until("two operator replicas Ready again",
                   lambda: len([p for p in operator_pods() if ready(p)]) == 2, timeout=120)

    # --- 6. a workload pod dies mid-capture --------------------------------------------------

    def test_07_workload_pod_deleted_mid_capture(self):
        victim = pods(NS, "app=e2e-trainer")[0]["metadata"]["name"]
        apply(profile_job("e2e-pod-lost", duration_ms=5000, delay_ms=1000), NS)
        wait_until("e2e-pod-lost capturing", lambda: job("e2e-pod-lost").get("status", {})
                   .get("phase") == "Capturing", timeout=30, interval=0.05)
        time.sleep(1.5)  # inside the window
        kubectl("delete", "pod", victim, "-n", NS, "--grace-period=0", "--force")
        done = wait_job_done("e2e-pod-lost", timeout=120)
        status = done["status"]
        self.assertEqual(status["phase"], "PartiallySucceeded", json.dumps(status, indent=1))
        self.assertEqual(status["summary"]["succeeded"], 2)
        failed = [t for t in status["targets"] if t["phase"] != "Succeeded"]
        self.assertEqual([t["name"] for t in failed], [victim])
        self.assertTrue(failed[0].get("message"), failed[0])
        self.assertIn(victim, status.get("message", "") + json.dumps(status.get("conditions")))
        log("%s deleted mid-capture: %s; %s" % (victim, status["phase"], failed[0]["message"]))
        wait_until("3 trainer pods Ready again",
                   lambda: len([p for p in pods(NS, "app=e2e-trainer") if ready(p)]) == 3,
                   timeout=120)

    # --- 8. bad input ------------------------------------------------------------------------

    def test_08_image_missing_on_the_node(self):
        apply("""
apiVersion: v1
kind: Pod
metadata: {name: missing-image, labels: {app: e2e-missing}}
spec:
  containers:
  - {name: trainer, image: "localhost/clusterprof/example-workload:no-such-tag",
     imagePullPolicy: Never}
""", NS)
        events = wait_until("the missing image's event", lambda: [
            e for e in pod_events(NS, "missing-image") if "ErrImageNeverPull" in e or
            "not present" in e], timeout=60)
        self.assertIn("no-such-tag", " ".join(events))
        # The kubelet writes the event before the pod's status: wait for the status, then give
        # the operator's pod watch a moment to bring it into its cache.
        wait_until("the pod's status to say why", lambda: "ErrImageNeverPull" in json.dumps(
            kjson("get", "pod", "missing-image", "-n", NS)["status"]), timeout=60)
        time.sleep(1)
        apply(profile_job("e2e-missing", selector="e2e-missing", duration_ms=500, delay_ms=500),
              NS)
        status = wait_job_done("e2e-missing", timeout=60)["status"]
        self.assertEqual(status["phase"], "Failed", json.dumps(status, indent=1))
        text = status.get("message", "") + json.dumps(status.get("conditions"))
        self.assertIn("missing-image", text)
        self.assertRegex(text, r"ErrImageNeverPull|not present|no-such-tag")
        log("missing image: %s" % status.get("message"))
        kubectl("delete", "pod", "missing-image", "-n", NS, "--wait=false")

    def test_09_logdir_the_sidecars_may_not_write(self):
        apply(profile_job("e2e-forbidden-logdir", duration_ms=500, delay_ms=500,
                          logdir="gs://%s/elsewhere" % BUCKET), NS)
        status = wait_job_done("e2e-forbidden-logdir", timeout=60)["status"]
        self.assertEqual(status["phase"], "Failed", json.dumps(status, indent=1))
        text = status.get("message", "") + json.dumps(status.get("targets"))
        self.assertIn("gs://%s/elsewhere" % BUCKET, text)
        self.assertRegex(text, r"(?i)allowed|permission")
        log("forbidden logdir: %s" % status.get("message"))

    # --- 9. a broken sidecar beside a healthy workload ---------------------------------------
    # docs/webhook.md, "The profiler never holds the workload back": the workload starts and is
    # never restarted, the pod is Ready as the workload is (except where Kubernetes counts a
    # container whose image it cannot pull), and a ProfileJob names the pod and says why.

    def broken_sidecar_namespace(self, namespace):
        kubectl("create", "namespace", namespace)
        kubectl("label", "namespace", namespace, "clusterprof.io/inject=true")
        wait_until("serviceaccount/default in %s" % namespace,
                   lambda: kubectl("get", "serviceaccount", "default", "-n", namespace)
                   .returncode == 0)

    def trainer_pod(self, name, app, extra_spec=""):
        return """
apiVersion: v1
kind: Pod
metadata: {name: %s, labels: {app: %s}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - {name: trainer, image: %s, imagePullPolicy: Never,
     args: ["/usr/bin/train_loop", "--busy-percent", "1"]}
%s""" % (name, app, WORKLOAD_IMAGE, extra_spec)

    def assert_workload_unharmed(self, pod, sidecar_running=True):
        """The trainer runs and was never restarted; the sidecar container (when its image is
        there) runs too and was never restarted: its failures stay inside it."""
        statuses = {c["name"]: c for c in pod["status"]["containerStatuses"]}
        name = pod["metadata"]["name"]
        self.assertIn("running", statuses["trainer"]["state"], (name, statuses["trainer"]))
        self.assertEqual(statuses["trainer"]["restartCount"], 0, name)
        if sidecar_running:
            self.assertIn("running", statuses["clusterprof-sidecar"]["state"], name)
            self.assertEqual(statuses["clusterprof-sidecar"]["restartCount"], 0, name)
            self.assertTrue(ready(pod), (name, pod["status"].get("conditions")))

    def failed_job_names(self, job_name, namespace, pod_name):
        apply(profile_job(job_name, selector=pod_name, duration_ms=500, delay_ms=500), namespace)
        status = wait_job_done(job_name, timeout=120, namespace=namespace)["status"]
        self.assertEqual(status["phase"], "Failed", json.dumps(status, indent=1))
        text = " ".join([status.get("message", ""), json.dumps(status.get("conditions")),
                         json.dumps(status.get("targets", []))])
        self.assertIn(pod_name, text)
        return status, text

    def test_09b_a_missing_token_secret_never_holds_the_pod(self):
        # A namespace labelled for injection that the chart's auth.namespaces does not list.
        namespace = "no-token"
        self.broken_sidecar_namespace(namespace)
        apply(self.trainer_pod("no-token", "no-token"), namespace)
        pod = wait_until("pod no-token Ready", lambda: (lambda p: ready(p) and p)(
            kjson("get", "pod", "no-token", "-n", namespace)), timeout=90)
        secret = [v["secret"] for v in pod["spec"]["volumes"] if v["name"] == "clusterprof-token"]
        self.assertEqual(len(secret), 1, pod["spec"]["volumes"])
        self.assertTrue(secret[0].get("optional"), secret)
        logs = wait_until("the sidecar to say it waits for its token", lambda: (lambda text: (
            "--auth-token-file" in text and "starting it again" in text) and text)(
                kubectl("logs", "no-token", "-n", namespace, "-c", "clusterprof-sidecar",
                        check=False).stdout), timeout=60)
        log("no token Secret: %s" % logs.strip().splitlines()[-1][:300])
        self.assert_workload_unharmed(kjson("get", "pod", "no-token", "-n", namespace))
        status, text = self.failed_job_names("no-token-1", namespace, "no-token")
        log("ProfileJob over it: %s" % status.get("message"))

        # The Secrets created in the namespace, as `helm upgrade --set auth.namespaces=...`
        # would: the token and the sidecar's TLS certificate; the kubelet projects them into the
        # optional volumes and the sidecar serves.
        names = [secret[0]["secretName"]] + [
            v["secret"]["secretName"] for v in pod["spec"]["volumes"]
            if v["name"] == "clusterprof-tls"]
        for name in names:
            copy = kjson("get", "secret", name, "-n", NS)
            apply(json.dumps({"apiVersion": "v1", "kind": "Secret", "type": copy.get("type"),
                              "metadata": {"name": copy["metadata"]["name"]},
                              "data": copy["data"]}), namespace)
        wait_until("the sidecar to serve with its token", lambda: "serving" in kubectl(
            "logs", "no-token", "-n", namespace, "-c", "clusterprof-sidecar",
            check=False).stdout.split("starting it again")[-1], timeout=240, interval=2)
        apply(profile_job("no-token-2", selector="no-token", duration_ms=500, delay_ms=500),
              namespace)
        status = wait_job_done("no-token-2", namespace=namespace)["status"]
        self.assertEqual(status["phase"], "Succeeded", json.dumps(status, indent=1))
        self.assert_workload_unharmed(kjson("get", "pod", "no-token", "-n", namespace))

    def test_09c_a_sidecar_that_exits_at_start_leaves_the_pod_ready(self):
        # The pod brings its own shared volume, read-only (a ConfigMap): the sidecar cannot
        # write its control page there and exits at every start.
        namespace = "sidecar-exits"
        self.broken_sidecar_namespace(namespace)
        kubectl("create", "configmap", "read-only", "-n", namespace, "--from-literal=a=b")
        apply(self.trainer_pod("sidecar-exits", "sidecar-exits", """  volumes:
  - {name: clusterprof-shm, configMap: {name: read-only}}
"""), namespace)
        wait_until("pod sidecar-exits Ready", lambda: (lambda p: ready(p) and p)(
            kjson("get", "pod", "sidecar-exits", "-n", namespace)), timeout=90)
        logs = wait_until("the sidecar to exit twice", lambda: (lambda text: text.count(
            "clusterprof-sidecar exited with status") >= 2 and text)(
                kubectl("logs", "sidecar-exits", "-n", namespace, "-c", "clusterprof-sidecar",
                        check=False).stdout), timeout=60)
        self.assertIn("/var/run/clusterprof", logs)
        self.assert_workload_unharmed(kjson("get", "pod", "sidecar-exits", "-n", namespace))
        status, text = self.failed_job_names("sidecar-exits", namespace, "sidecar-exits")
        log("sidecar exits at start: pod Ready; ProfileJob: %s" % status.get("message"))

    def test_09d_a_missing_sidecar_image_does_not_stop_the_workload(self):
        # The pod as the webhook injects it (a server-side dry run), with the sidecar's image
        # one the node does not have; created with the injected label, the webhook leaves it.
        namespace = "missing-sidecar"
        self.broken_sidecar_namespace(namespace)
        injected = json.loads(kubectl("create", "--dry-run=server", "-o", "json", "-n",
                                      namespace, "-f", "-", input=self.trainer_pod(
                                          "missing-sidecar", "missing-sidecar")).stdout)
        containers = injected["spec"]["containers"] + injected["spec"].get("initContainers", [])
        sidecar = [c for c in containers if c["name"] == "clusterprof-sidecar"]
        self.assertEqual(len(sidecar), 1, [c["name"] for c in containers])
        sidecar[0]["image"] = "localhost/clusterprof/sidecar:no-such-tag"
        for key in ("uid", "resourceVersion", "creationTimestamp", "managedFields"):
            injected["metadata"].pop(key, None)
        injected.pop("status", None)
        start = time.monotonic()
        apply(json.dumps(injected), namespace)
        pod = wait_until("the trainer running", lambda: (lambda p: any(
            c["name"] == "trainer" and "running" in c["state"]
            for c in p["status"].get("containerStatuses", [])) and p)(
                kjson("get", "pod", "missing-sidecar", "-n", namespace)), timeout=90)
        figures["trainer_running_beside_a_missing_sidecar_image_s"] = round(
            time.monotonic() - start, 2)
        wait_until("the sidecar's image error", lambda: "ErrImageNeverPull" in json.dumps(
            kjson("get", "pod", "missing-sidecar", "-n", namespace)["status"]), timeout=60)
        pod = kjson("get", "pod", "missing-sidecar", "-n", namespace)
        self.assert_workload_unharmed(pod, sidecar_running=False)
        # Kubernetes counts every container for Ready: with a regular-container sidecar the
        # pod is not Ready while its image is missing (docs/webhook.md says so).
        self.assertFalse(ready(pod))
        time.sleep(1)  # the operator's pod cache catches up with the status
        status, text = self.failed_job_names("missing-sidecar", namespace, "missing-sidecar")
        self.assertIn("clusterprof-sidecar", text)
        self.assertRegex(text, r"ErrImageNeverPull|no-such-tag")
        log("missing sidecar image: trainer running after %.2f s; ProfileJob: %s" % (
            figures["trainer_running_beside_a_missing_sidecar_image_s"], status.get("message")))

    # --- 9e. a ProfileTrigger -----------------------------------------------------------------

    def test_09e_a_trigger_catches_a_rank_that_degrades_mid_run(self):
        # Four ranks in lockstep (train_loop's file barrier, in a directory of the node the pods
        # share); ranks-2 computes 20 ms more per step from 25 s after it starts.
        sync = tempfile.mkdtemp(prefix="clusterprof-e2e-sync-")
        os.chmod(sync, 0o1777)
        apply("""
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: ranks}
spec:
  replicas: 4
  podManagementPolicy: Parallel
  serviceName: ranks
  selector: {matchLabels: {app: e2e-ranks}}
  template:
    metadata: {labels: {app: e2e-ranks}}
    spec:
      terminationGracePeriodSeconds: 2
      containers:
      - name: trainer
        image: %s
        imagePullPolicy: Never
        command: ["/bin/sh", "-c"]
        args:
        - |
          rank="${HOSTNAME##*-}"
          if [ "$rank" = 2 ]; then set -- --straggle-ms 30 --straggle-after-seconds 25; fi
          exec /usr/bin/train_loop --sync-dir /sync --world 4 --rank "$rank" --step-ms 100 \
            --busy-percent 5 "$@"
        resources: {requests: {cpu: 10m}}
        volumeMounts: [{name: sync, mountPath: /sync}]
      volumes:
      - {name: sync, hostPath: {path: %s, type: Directory}}
""" % (WORKLOAD_IMAGE, sync), NS)
        apply("""
apiVersion: clusterprof.io/v1alpha1
kind: ProfileTrigger
metadata: {name: ranks-degrade}
spec:
  targets: {selector: {matchLabels: {app: e2e-ranks}}}
  rules:
  - stepTimeRegression: {percent: 50, steps: 10}
  - straggler: {steps: 20}
  capture: {durationMs: 2000, lookbackMs: 10000, logdir: %s,
            options: {hostTracerLevel: 2, deviceTracerLevel: 0}}
  cooldownSeconds: 600
""" % LOGDIR, NS)
        try:
            wait_until("4 ranks Ready", lambda: len(
                [p for p in pods(NS, "app=e2e-ranks") if ready(p)]) == 4, timeout=180)
            trigger = lambda: kjson("get", "profiletrigger", "ranks-degrade", "-n", NS)

            def watching_every_pod():
                status = trigger().get("status", {})
                conditions = {c["type"]: c for c in status.get("conditions", [])}
                return (status.get("podsWithSteps") == 4 and
                        conditions.get("NoStepTelemetry", {}).get("status") == "False")
            wait_until("the trigger following the steps of 4 pods", watching_every_pod,
                       timeout=90)
            self.assertNotIn("lastJob", trigger()["status"], "fired before the rank slowed down")
            fired = wait_until("the trigger to fire",
                               lambda: trigger().get("status", {}).get("lastJob"), timeout=120)
            status = trigger()["status"]
            firing = status["recentFirings"][0]
            self.assertEqual(firing["rule"], "straggler", json.dumps(status, indent=1))
            self.assertEqual(firing["pods"], ["ranks-2"], firing)
            done = wait_job_done(fired, timeout=120)
            job_status = done["status"]
            self.assertEqual(job_status["phase"], "Succeeded", json.dumps(job_status, indent=1))
            self.assertEqual(job_status["summary"]["succeeded"], 4)
            self.assertEqual(done["metadata"]["labels"].get("clusterprof.io/trigger"),
                             "ranks-degrade")
            for target in job_status["targets"]:
                self.assertGreater(target.get("lookbackMs", 0), 5000, target)
            self.assertEqual(job_status["analysis"]["stragglers"], "ranks-2",
                             json.dumps(job_status["analysis"], indent=1))
            events = pod_events(NS, "ranks-degrade")
            self.assertTrue(any("Triggered" in e and "ranks-2" in e for e in events), events)
            # The trace of ranks-2 reaches back to the step it slowed down at.
            said = re.search(r"slows down by \d+ ms per step from step (\d+)",
                             kubectl("logs", "ranks-2", "-n", NS, "-c", "trainer").stdout)
            self.assertIsNotNone(said, "ranks-2 never said it slowed down")
            onset = int(said.group(1))
            host_file = "%s/plugins/profile/%s/ranks-2.xplane.pb" % (LOGDIR, job_status["runName"])
            trace = json.loads(self.cli("convert", host_file, "-o", "-").stdout)
            events = trace["traceEvents"] if isinstance(trace, dict) else trace
            steps = [int(e["args"]["step_num"]) for e in events
                     if e.get("name") == "train" and "step_num" in e.get("args", {})]
            self.assertTrue(steps and min(steps) <= onset,
                            "the trace's steps %s..%s do not reach the onset, step %d" % (
                                min(steps or [0]), max(steps or [0]), onset))
            figures["trigger_detection_to_t0_ms"] = round(
                (job_status["startTimeNs"] - firing["detectedNs"]) / 1e6, 1)
            log("ranks-degrade fired on %s (%s); the capture starts %.1f ms after the step that "
                "completed the rule's window, reaches back to step %d (onset %d)" % (
                    firing["rule"], firing["evidence"], figures["trigger_detection_to_t0_ms"],
                    min(steps), onset))
            # Nothing more within the cooldown, though ranks-2 stays slow.
            time.sleep(10)
            jobs = kjson("get", "profilejobs", "-n", NS, "-l",
                         "clusterprof.io/trigger=ranks-degrade")["items"]
            self.assertEqual(len(jobs), 1, [j["metadata"]["name"] for j in jobs])
            self.assertEqual(trigger()["status"]["capturesToday"], 1)
        finally:
            kubectl("delete", "profiletrigger", "ranks-degrade", "-n", NS, "--wait=false",
                    check=False)
            kubectl("delete", "statefulset", "ranks", "-n", NS, "--wait=false", check=False)

    # --- 10. helm uninstall ------------------------------------------------------------------

    def test_10_helm_uninstall(self):
        self.save_diagnostics()  # the operator's logs go with it
        run([self.helm, "uninstall", RELEASE, "-n", SYSTEM_NS, "--wait", "--timeout", "120s"],
            timeout=150)
        selector = "app.kubernetes.io/instance=%s" % RELEASE
        for kind in ("deployments", "services", "configmaps", "secrets", "serviceaccounts",
                     "roles", "rolebindings", "poddisruptionbudgets", "networkpolicies"):
            left = kjson("get", kind, "-A", "-l", selector)["items"]
            self.assertEqual([x["metadata"]["name"] for x in left], [], kind)
        for kind in ("clusterroles", "clusterrolebindings", "mutatingwebhookconfigurations"):
            left = kjson("get", kind, "-l", selector)["items"]
            self.assertEqual([x["metadata"]["name"] for x in left], [], kind)
        wait_until("the operator pods gone", lambda: operator_pods() == [], timeout=90)
        crds = {c["metadata"]["name"] for c in kjson("get", "crds")["items"]}
        self.assertIn("profilejobs.clusterprof.io", crds)
        self.assertIn("profileschedules.clusterprof.io", crds)
        # The workloads keep running, sidecars and all.
        running = [p for p in pods(NS, "app=e2e-trainer") if ready(p)]
        self.assertEqual(len(running), 3)


if __name__ == "__main__":
    if not os.path.exists(os.path.join(NODE_DIR, "env")):
        sys.stderr.write("node_e2e: no node in %s (the node fixture did not start one; its "
                         "output says why)\n" % NODE_DIR)
        sys.exit(SKIP_CODE)
    unittest.main(verbosity=2)
