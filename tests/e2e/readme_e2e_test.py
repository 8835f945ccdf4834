#!/usr/bin/env python3
"""README.md's "On Kubernetes" commands, run as written on a real node, and the cluster
conventions around them.

Runs after node_e2e_test on the same single-node cluster (tests/e2e/node_fixture), which that
test leaves without a release. Steps, in the order of their names:

 1. The README's install block, taken from README.md (the fenced block under "On Kubernetes"
    that runs `helm install`), with only the registry (the images scripts/build-images made,
    imported into the node) and the bucket (the node's GCS test server) replaced, and
    examples/profilejob.yaml with the same bucket. Helm gets one more value, the GCS test
    server's address (what Workload Identity is on GKE). Before it, `helm install` without
    image.registry is refused with the value to set, and a user bound to `edit` cannot create
    ProfileJobs. After it: the ProfileJob Succeeded with a file per pod in the bucket.
 2. Users' roles: the chart's aggregated ClusterRoles reach edit and view through the real
    controller-manager's clusterrole aggregation: `kubectl auth can-i` and real creates as a
    user bound to `edit` in one namespace only, and as a `view` user.
 3. Pod Security: the injected pods, as the real webhook made them, checked against the
    `restricted` Pod Security Standard (tests/helm/pod_security.py), the sidecar container and
    the volumes it added by name.
 4. `helm uninstall`, then the upgrade path: the chart of the last commit (git archive, no
    change to the working tree) installed, a ProfileJob using a field the new CRD adds is
    pruned by the old CRD, the new CRDs applied server-side, `helm upgrade` to this chart, and
    the same field accepted and kept. When the two charts' CRDs do not differ, the test adds the
    field to a copy of the CRD, to prove the sequence. Then everything it made is removed.

Exit 77 (skipped) when the fixture did not start a node.
"""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import unittest

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "helm"))
import node_e2e_test as node  # noqa: E402  (helpers: kubectl, wait_until, pods, ...)
import pod_security  # noqa: E402
from node_e2e_test import (BINARY_DIR, KUBE_NODE, NODE_DIR, SKIP_CODE, SOURCE_DIR, VERSION,  # noqa: E402
                           find_helm, kjson, kubectl, pods, read_env, ready, run,
                           start_gcs_test_server, stop_gcs_test_server, wait_until)

RELEASE = "clusterprof"
SYSTEM_NS = "clusterprof-system"
NS = "training"
BUCKET = "e2e"
# What the README names, and what the test puts in their place.
README_REGISTRY = "us-central1-docker.pkg.dev/my-project/clusterprof"
README_BUCKET = "my-bucket"
LOCAL_REGISTRY = "localhost/clusterprof"  # scripts/build-images' names
WORKLOAD_IMAGE = "localhost/clusterprof/example-workload:%s" % VERSION
EDITOR = "alice@example.com"
VIEWER = "bob@example.com"
# The restricted Pod Security Standard, for the workload container the test owns.
RESTRICTED_CONTAINER = {
    "runAsNonRoot": True, "runAsUser": 65532, "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}


def log(message):
    sys.stderr.write("readme_e2e: %s\n" % message)
    sys.stderr.flush()


def readme_blocks():
    """The fenced sh blocks of README.md's "On Kubernetes" section."""
    with open(os.path.join(SOURCE_DIR, "README.md")) as f:
        text = f.read()
    section = text.split("\n## On Kubernetes\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^```sh\n(.*?)^```", section, re.S | re.M)


def readme_install_block():
    blocks = [b for b in readme_blocks() if "helm install" in b]
    assert len(blocks) == 1, "README.md, On Kubernetes: %d blocks run helm install" % len(blocks)
    return blocks[0]


def strip_cel(node):
    """The CRD without its CEL rules (x-kubernetes-validations), which Kubernetes 1.20 does not
    know: its server-side apply refuses the field, where 1.25+ (GKE) takes the file as it is."""
    if isinstance(node, dict):
        return {k: strip_cel(v) for k, v in node.items() if k != "x-kubernetes-validations"}
    if isinstance(node, list):
        return [strip_cel(v) for v in node]
    return node


def apply_crds(directory, work):
    """docs/install.md's `kubectl apply --server-side --force-conflicts -f helm/clusterprof/crds/`,
    on this 1.20 node (CEL rules left out: strip_cel)."""
    out = tempfile.mkdtemp(dir=work, prefix="crds-")
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".yaml"):
            continue
        with open(os.path.join(directory, name)) as f:
            documents = [strip_cel(d) for d in yaml.safe_load_all(f) if d]
        with open(os.path.join(out, name), "w") as f:
            yaml.safe_dump_all(documents, f, sort_keys=False)
    kubectl("apply", "--server-side", "--force-conflicts", "-f", out)


def can_i(verb, resource, namespace, user, *extra):
    result = kubectl("auth", "can-i", verb, resource, "-n", namespace, "--as", user, *extra,
                     check=False)
    return result.stdout.strip()


def trainer_deployment(name, label):
    return """
apiVersion: apps/v1
kind: Deployment
metadata: {name: %s}
spec:
  replicas: 2
  selector: {matchLabels: {app: %s}}
  template:
    metadata: {labels: {app: %s}}
    spec:
      terminationGracePeriodSeconds: 2
      securityContext: {runAsNonRoot: true, seccompProfile: {type: RuntimeDefault}}
      containers:
      - name: trainer
        image: %s
        args: ["/usr/bin/train_loop", "--busy-percent", "5", "--step-ms", "50"]
        resources: {requests: {cpu: 10m}}
        securityContext: %s
""" % (name, label, label, WORKLOAD_IMAGE, json.dumps(RESTRICTED_CONTAINER))


class ReadmeE2E(unittest.TestCase):
    gcs = None

    @classmethod
    def setUpClass(cls):
        env = read_env(os.path.join(NODE_DIR, "env"))
        os.environ["KUBECONFIG"] = env["KUBECONFIG"]
        cls.node_ip = env["CLUSTERPROF_NODE_IP"]
        cls.helm = find_helm()
        if not cls.helm:
            raise unittest.SkipTest("no helm: run scripts/install-helm")
        cls.work = tempfile.mkdtemp(prefix="readme-e2e-")
        cls.gcs, cls.gcs_log, cls.gcs_host = start_gcs_test_server(cls.work, cls.node_ip)
        # node_e2e_test leaves its workloads in the namespace: start from none.
        kubectl("delete", "namespace", NS, "--ignore-not-found", "--wait=false")
        wait_until("namespace %s gone" % NS, lambda: kubectl(
            "get", "namespace", NS, check=False).returncode != 0, timeout=180, interval=1)

    @classmethod
    def tearDownClass(cls):
        if cls.gcs:
            stop_gcs_test_server(cls.gcs, cls.gcs_log)
        shutil.rmtree(cls.work, ignore_errors=True)

    def helm_run(self, *args, check=True, timeout=180):
        return run([self.helm] + list(args), check=check, timeout=timeout)

    def cli(self, *args):
        return run([KUBE_NODE, "exec", NODE_DIR, "--", "env",
                    "STORAGE_EMULATOR_HOST=%s" % self.gcs_host,
                    os.path.join(BINARY_DIR, "cli", "clusterprof")] + list(args), timeout=60)

    # --- 1. the README's block -----------------------------------------------------------------

    def test_01_readme_install_block(self):
        block = readme_install_block()
        self.assertIn(README_REGISTRY, block)
        self.assertIn("gs://%s/" % README_BUCKET, block)
        self.assertIn("auth.namespaces", block)
        # The push block names the archives scripts/build-images writes.
        pushes = [b for b in readme_blocks() if "skopeo copy" in b]
        self.assertEqual(len(pushes), 1)
        for image in ("operator", "sidecar"):
            archive = os.path.join(BINARY_DIR, "e2e", "images", "clusterprof-%s.oci.tar" % image)
            self.assertTrue(os.path.exists(archive), archive)
        self.assertIn("oci-archive:out/images/clusterprof-$image.oci.tar", pushes[0])
        self.assertIn("docker://%s/$image:%s" % (README_REGISTRY, VERSION), pushes[0])

        # The workload the README assumes, before clusterprof.
        kubectl("create", "namespace", NS)
        wait_until("serviceaccount/default in %s" % NS,
                   lambda: kubectl("get", "serviceaccount", "default", "-n", NS).returncode == 0)
        node.apply(trainer_deployment("llama-trainer", "llama-trainer"), NS)
        kubectl("create", "rolebinding", "editor", "--clusterrole=edit", "--user=" + EDITOR,
                "-n", NS)
        kubectl("create", "rolebinding", "viewer", "--clusterrole=view", "--user=" + VIEWER,
                "-n", NS)
        # Without the chart, edit grants nothing of clusterprof.io.
        self.assertEqual(can_i("create", "profilejobs.clusterprof.io", NS, EDITOR), "no")

        # Without image.registry, the README's helm install is refused and says what to set.
        install = [l for l in block.replace("\\\n", " ").splitlines() if "helm install" in l][0]
        argv = shlex.split(install, comments=True)
        registry_at = argv.index("image.registry=%s" % README_REGISTRY)
        argv = [os.path.join(SOURCE_DIR, "helm", "clusterprof") if a == "./helm/clusterprof"
                else a for a in argv[1:registry_at - 1] + argv[registry_at + 1:]]
        refused = self.helm_run(*(argv + ["--dry-run"]), check=False)
        self.assertNotEqual(refused.returncode, 0)
        self.assertIn("image.registry is not set", refused.stderr)
        self.assertIn("--set image.registry=", refused.stderr)

        # The block, with the registry and the bucket replaced, in a copy of the tree's files it
        # names (the example with the same bucket).
        tree = os.path.join(self.work, "tree")
        os.makedirs(os.path.join(tree, "examples"))
        os.symlink(os.path.join(SOURCE_DIR, "helm"), os.path.join(tree, "helm"))
        with open(os.path.join(SOURCE_DIR, "examples", "profilejob.yaml")) as f:
            example = f.read()
        self.assertIn("gs://%s/" % README_BUCKET, example)
        with open(os.path.join(tree, "examples", "profilejob.yaml"), "w") as f:
            f.write(example.replace("gs://%s/" % README_BUCKET, "gs://%s/" % BUCKET))
        script = block.replace(README_REGISTRY, LOCAL_REGISTRY).replace(
            "gs://%s/" % README_BUCKET, "gs://%s/" % BUCKET)
        # helm, with the GCS test server's address for the sidecars and the operator.
        bin_dir = os.path.join(self.work, "bin")
        os.makedirs(bin_dir)
        with open(os.path.join(bin_dir, "helm"), "w") as f:
            f.write('#!/bin/sh\ncase "$1" in install|upgrade) ;; *) exec %s "$@" ;; esac\n'
                    'exec %s "$@" --set sidecar.extraEnv.STORAGE_EMULATOR_HOST=%s '
                    '--set "operator.extraEnv[0].name=STORAGE_EMULATOR_HOST" '
                    '--set "operator.extraEnv[0].value=%s"\n'
                    % (self.helm, self.helm, self.gcs_host, self.gcs_host))
        os.chmod(os.path.join(bin_dir, "helm"), 0o755)
        # kubectl finds the plugin on PATH, as after `cmake --install`.
        env = dict(os.environ, PATH=os.pathsep.join(
            [bin_dir, os.path.join(BINARY_DIR, "cli"), os.environ["PATH"]]))
        log("running README.md's block:\n" + script)
        result = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tree, env=env,
                                capture_output=True, text=True, timeout=600)
        log("its output:\n" + result.stdout + result.stderr)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        created = re.search(r"profilejob\.clusterprof\.io/(\S+) created", result.stdout)
        self.assertTrue(created, result.stdout)
        job_name = created.group(1)
        self.assertIn("profilejob/%s: Succeeded, 2/2 target(s) captured" % job_name,
                      result.stdout)
        # helm test ran the sidecar image (templates/tests/sidecar-image-test.yaml).
        self.assertRegex(result.stdout, r"sidecar-image-test\s+Last Started:.*\s+Last Completed:"
                         r".*\s+Phase:\s+Succeeded")

        done = kjson("get", "profilejob", job_name, "-n", NS)
        status = done["status"]
        self.assertEqual(status["phase"], "Succeeded", json.dumps(status, indent=1))
        self.assertEqual(status["summary"]["succeeded"], 2)
        run_dir = "gs://%s/tensorboard/llama/plugins/profile/%s" % (BUCKET, status["runName"])
        table = self.cli("inspect", "--brief", run_dir).stdout
        for pod in pods(NS, "app=llama-trainer"):
            if pod["metadata"].get("deletionTimestamp"):
                continue
            self.assertIn(pod["metadata"]["name"], table)

    # --- 2. users' roles -----------------------------------------------------------------------

    def test_02_edit_and_view_users(self):
        # The clusterrole aggregation controller adds the chart's rules to edit, admin and view.
        wait_until("edit to allow ProfileJobs", lambda: can_i(
            "create", "profilejobs.clusterprof.io", NS, EDITOR) == "yes", timeout=60)
        for verb in ("create", "delete", "patch", "list", "watch"):
            for kind in ("profilejobs.clusterprof.io", "profileschedules.clusterprof.io"):
                self.assertEqual(can_i(verb, kind, NS, EDITOR), "yes", (verb, kind))
                # A namespace where the user has no role.
                self.assertEqual(can_i(verb, kind, "default", EDITOR), "no", (verb, kind))
        status = ("--subresource", "status")
        self.assertEqual(can_i("get", "profilejobs.clusterprof.io", NS, EDITOR, *status), "yes")
        self.assertEqual(can_i("update", "profilejobs.clusterprof.io", NS, EDITOR, *status), "no")
        wait_until("view to allow reading ProfileJobs", lambda: can_i(
            "list", "profilejobs.clusterprof.io", NS, VIEWER) == "yes", timeout=60)
        self.assertEqual(can_i("create", "profilejobs.clusterprof.io", NS, VIEWER), "no")

        # Real requests with those identities.
        job = node.profile_job("by-editor", selector="llama-trainer", duration_ms=500,
                               delay_ms=500, logdir="gs://%s/tensorboard/editor" % BUCKET)
        created = kubectl("apply", "-n", NS, "--as", EDITOR, "-f", "-", input=job, check=False)
        self.assertEqual(created.returncode, 0, created.stderr)
        refused = kubectl("apply", "-n", "default", "--as", EDITOR, "-f", "-", input=job,
                          check=False)
        self.assertNotEqual(refused.returncode, 0)
        self.assertIn("forbidden", refused.stderr.lower())
        listed = kubectl("get", "pj", "-n", NS, "--as", VIEWER, check=False)
        self.assertEqual(listed.returncode, 0, listed.stderr)
        self.assertIn("by-editor", listed.stdout)
        refused = kubectl("delete", "pj", "by-editor", "-n", NS, "--as", VIEWER, check=False)
        self.assertIn("forbidden", refused.stderr.lower())
        deleted = kubectl("delete", "pj", "by-editor", "-n", NS, "--as", EDITOR, check=False)
        self.assertEqual(deleted.returncode, 0, deleted.stderr)

    # --- 3. Pod Security -----------------------------------------------------------------------

    def test_03_injected_pods_meet_the_restricted_standard(self):
        running = [p for p in pods(NS, "app=llama-trainer") if ready(p)]
        self.assertTrue(running)
        for pod in running:
            spec = pod["spec"]
            name = pod["metadata"]["name"]
            sidecars = [c for c in spec.get("containers", []) + spec.get("initContainers", [])
                        if c["name"] == "clusterprof-sidecar"]
            self.assertEqual(len(sidecars), 1, name)
            # The sidecar and the volumes the webhook added, alone: what the lead's webhook
            # contributes to any pod.
            added_volumes = [v for v in spec.get("volumes", [])
                             if v["name"].startswith("clusterprof")]
            self.assertTrue(added_volumes, name)
            alone = {"securityContext": {}, "containers": sidecars, "volumes": added_volumes}
            self.assertEqual(pod_security.check(alone), [], "%s: the injected sidecar" % name)
            # The whole pod: a restricted workload stays restricted once injected.
            self.assertEqual(pod_security.check(spec, pod["metadata"].get("annotations")), [],
                             "%s: the injected pod" % name)

    # --- 4. uninstall, then the upgrade path ---------------------------------------------------

    def test_04_uninstall_and_upgrade_from_the_last_commit(self):
        self.helm_run("uninstall", RELEASE, "-n", SYSTEM_NS, "--wait", "--timeout", "120s")
        kubectl("delete", "namespace", NS, "--wait=false")
        wait_until("namespace %s gone" % NS, lambda: kubectl(
            "get", "namespace", NS, check=False).returncode != 0, timeout=180, interval=1)
        kubectl("create", "namespace", NS)

        # The last commit's chart and values, without touching the working tree.
        old = os.path.join(self.work, "old")
        os.makedirs(old)
        archive = subprocess.run(
            ["git", "-C", SOURCE_DIR, "archive", "HEAD", "helm/clusterprof",
             "tests/e2e/local-node-values.yaml"], capture_output=True, timeout=60)
        if archive.returncode != 0:
            self.skipTest("no git history: %s" % archive.stderr.decode()[:200])
        subprocess.run(["tar", "-x", "-C", old], input=archive.stdout, check=True)
        old_chart = os.path.join(old, "helm", "clusterprof")
        common = ["--set", "sidecar.allowedLogdirs={gs://%s/tensorboard}" % BUCKET,
                  "--set", "auth.namespaces={%s}" % NS, "--wait", "--timeout", "180s"]
        self.helm_run("install", RELEASE, old_chart, "-n", SYSTEM_NS, "-f",
                      os.path.join(old, "tests", "e2e", "local-node-values.yaml"), *common,
                      timeout=240)
        # Helm installs crds/ on a fresh install only if they are missing; they are there from
        # before, so put the old ones in place, as a cluster installed from that commit has.
        apply_crds(os.path.join(old_chart, "crds"), self.work)

        # A field the new CRD has and the old one lacks; a copy of the CRD gets one if none.
        new_crds = os.path.join(self.work, "new-crds")
        shutil.copytree(os.path.join(SOURCE_DIR, "helm", "clusterprof", "crds"), new_crds)
        field, value = self.new_spec_field(old_chart, new_crds)
        log("upgrade: ProfileJob field spec.%s" % field)
        job = {"apiVersion": "clusterprof.io/v1alpha1", "kind": "ProfileJob",
               "metadata": {"name": "upgrade-check"},
               "spec": {"targets": {"addresses": ["10.0.0.1:8466"]}, "durationMs": 500,
                        "logdir": "gs://%s/tensorboard/upgrade" % BUCKET, field: value}}
        # The server's own pruning decides (kubectl's client-side check would refuse the field
        # before the server saw it, and may lag behind a CRD that just changed).
        kubectl("apply", "--validate=false", "-n", NS, "-f", "-", input=json.dumps(job))
        stored = kjson("get", "pj", "upgrade-check", "-n", NS)
        self.assertNotIn(field, stored["spec"], "the old CRD kept spec.%s" % field)
        kubectl("delete", "pj", "upgrade-check", "-n", NS)

        # docs/install.md, "Upgrading": the CRDs first, then helm upgrade.
        apply_crds(new_crds, self.work)
        self.helm_run("upgrade", RELEASE, os.path.join(SOURCE_DIR, "helm", "clusterprof"),
                      "-n", SYSTEM_NS, "-f",
                      os.path.join(SOURCE_DIR, "tests", "e2e", "local-node-values.yaml"),
                      *common, timeout=240)
        def kept():
            kubectl("apply", "--validate=false", "-n", NS, "-f", "-", input=json.dumps(job))
            stored = kjson("get", "pj", "upgrade-check", "-n", NS)
            return stored if stored["spec"].get(field) == value else None
        # The API server takes a changed CRD's schema within moments of the apply.
        stored = wait_until("spec.%s kept by the new CRD" % field, kept, timeout=60, interval=1)
        self.assertEqual(stored["spec"].get(field), value, json.dumps(stored["spec"]))
        wait_until("the upgraded operator Ready", lambda: [
            p for p in node.operator_pods() if ready(p)], timeout=180)
        # The upgraded chart's objects are there: its user roles.
        roles = {r["metadata"]["name"] for r in kjson(
            "get", "clusterroles", "-l", "app.kubernetes.io/instance=%s" % RELEASE)["items"]}
        self.assertIn("clusterprof-edit", roles)

        # Clean up: the release, the namespace, the CRDs as this tree has them.
        kubectl("delete", "pj", "upgrade-check", "-n", NS, "--wait=false")
        self.helm_run("uninstall", RELEASE, "-n", SYSTEM_NS, "--wait", "--timeout", "120s")
        apply_crds(os.path.join(SOURCE_DIR, "helm", "clusterprof", "crds"), self.work)
        kubectl("delete", "namespace", NS, "--wait=false")
        left = kjson("get", "clusterroles", "-l",
                     "app.kubernetes.io/instance=%s" % RELEASE)["items"]
        self.assertEqual(left, [])

    def new_spec_field(self, old_chart, new_crds):
        """(name, value) of a ProfileJob spec field in new_crds that old_chart's CRD lacks,
        adding one to the copy in new_crds when there is none."""
        def spec_properties(path):
            with open(path) as f:
                crd = yaml.safe_load(f)
            version = [v for v in crd["spec"]["versions"] if v.get("storage")][0]
            return crd, version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        _, old_props = spec_properties(os.path.join(old_chart, "crds", "profilejob.yaml"))
        path = os.path.join(new_crds, "profilejob.yaml")
        crd, new_props = spec_properties(path)
        samples = {"string": "upgrade", "integer": 7, "boolean": True}
        for name in sorted(set(new_props) - set(old_props)):
            kind = new_props[name].get("type")
            if kind in samples and "enum" not in new_props[name]:
                return name, samples[kind]
        new_props["upgradeCheck"] = {"type": "string", "description": "added by the test"}
        with open(path, "w") as f:
            yaml.safe_dump(crd, f, sort_keys=False)
        return "upgradeCheck", "upgrade"


if __name__ == "__main__":
    if not os.path.exists(os.path.join(NODE_DIR, "env")):
        sys.stderr.write("readme_e2e: no node in %s (the node fixture did not start one; its "
                         "output says why)\n" % NODE_DIR)
        sys.exit(SKIP_CODE)
    unittest.main(verbosity=2)
