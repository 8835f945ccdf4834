#!/usr/bin/env python3
"""The Helm chart helm/clusterprof, rendered with the real helm binary.

`helm lint --strict` and `helm template` for the default values, each preset, cert-manager,
regular-container sidecars and authentication off; every rendered document is parsed and checked:
the kinds, RBAC (exactly the rules the operator's code needs, see EXPECTED_CLUSTER_ROLE_RULES),
the Deployment's flags, probes, mounts and security contexts, the MutatingWebhookConfiguration
and its certificate (verified with the openssl CLI), the injection config against the values,
the token Secret, the sidecars' TLS certificate and its CA (openssl), rotation without pod
restarts, the NetworkPolicy, the ServiceMonitor, the sidecars' PodMonitor, the Grafana
dashboard's ConfigMap, the PodDisruptionBudget, the schema's refusals, the refusal to render without image.registry, the users' aggregated ClusterRoles, and
the operator pod against the restricted Pod Security Standard (tests/helm/pod_security.py).

Helm comes from $CLUSTERPROF_HELM, else scripts/install-helm's cache, else PATH. Without it the
test exits 77, which ctest reports as skipped. tests/helm/chart_apply_integration_test.cc applies
the same rendering to a real API server and runs the operator under the rendered ClusterRole.
"""

import base64
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

try:
    import yaml
except ImportError:  # pragma: no cover - reported as a failure, not a skip
    sys.stderr.write("chart_test: PyYAML is missing (Debian: python3-yaml)\n")
    sys.exit(1)

SOURCE_DIR = os.environ.get(
    "CLUSTERPROF_SOURCE_DIR",
    os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
CHART = os.path.join(SOURCE_DIR, "helm", "clusterprof")
RELEASE = "clusterprof"
NAMESPACE = "clusterprof-system"
SKIP_CODE = 77
# Where the images are: the chart refuses to render without it (test_images_must_be_named).
REGISTRY = "registry.example/clusterprof"
BASE = ["--set", f"image.registry={REGISTRY}"]

# The ClusterRole, rule by rule, with the operator code that needs each verb. A verb that no code
# uses must not be granted, and one the code uses must be: the integration test runs the real
# operator under exactly this role.
#   (apiGroup, resource): verbs
EXPECTED_CLUSTER_ROLE_RULES = {
    # list, watch: the ProfileJob informer (operator/kube/informer.cc, started in
    #   operator/manager/manager.cc) and CheckApiAccess's list at start (manager.cc);
    # get: ProfileJobController::WriteStatus reads the latest copy (profilejob_controller.cc);
    # create: ProfileScheduleController creates a schedule's jobs (profileschedule_controller.cc);
    # delete: ttlSecondsAfterFinished (profilejob_controller.cc), history limits and
    #   concurrencyPolicy Replace (profileschedule_controller.cc).
    ("clusterprof.io", "profilejobs"): {"get", "list", "watch", "create", "delete"},
    # list, watch: the ProfileSchedule informer and CheckApiAccess (manager.cc). The schedule
    # controller writes status over its cached copy: no get.
    ("clusterprof.io", "profileschedules"): {"list", "watch"},
    # update: WriteStatus and UpdateStatus (PUT .../status); patch: the Capturing JSON patch sent
    # beside the Profile requests (profilejob_controller.cc, Patch(..., "status")).
    ("clusterprof.io", "profilejobs/status"): {"update", "patch"},
    # update: the schedule controller's write_status (profileschedule_controller.cc).
    ("clusterprof.io", "profileschedules/status"): {"update"},
    # list, watch: the ProfileTrigger informer and CheckTriggerApi (manager.cc); status is
    #   written over the cached copy or the one a firing just wrote: no get.
    ("clusterprof.io", "profiletriggers"): {"list", "watch"},
    # update: a firing recorded before its job is created, and the telemetry
    #   (profiletrigger_controller.cc).
    ("clusterprof.io", "profiletriggers/status"): {"update"},
    # list, watch: the pod informer (manager.cc), the targets of a job.
    ("", "pods"): {"list", "watch"},
    # create: EventRecorder's new events; patch: counting a repeated event
    #   (operator/kube/event_recorder.cc).
    ("", "events"): {"create", "patch"},
}

# Leader election (operator/kube/leader_election.cc): Get, Create and Update of the Lease, in the
# release namespace only (a Role). create cannot be limited by resourceNames.
EXPECTED_LEASE_RULES = [
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
     "resourceNames": ["clusterprof-operator"], "verbs": ["get", "update"]},
]

# What the injection config says for the default values: every key the operator reads
# (--injection-config, docs/webhook.md).
DEFAULT_INJECTION_CONFIG = {
    "image": f"{REGISTRY}/sidecar:0.1.0",
    "image_pull_policy": "IfNotPresent",
    "native_sidecar": True,
    "port": 8466,
    "http_port": 8467,
    "resources": {"requests": {"cpu": "100m", "memory": "128Mi"},
                  "limits": {"cpu": "1", "memory": "1Gi"}},
    "token_secret": "clusterprof-sidecar-token",
    "token_grace_seconds": 300,
    "tls_secret": "clusterprof-sidecar-tls",
    "allowed_logdirs": [],
    "framework_profiler": "",
    "gpu_library": "/usr/lib/clusterprof/libclusterprof_cupti.so",
    "recorder_level": 2,
    "recorder_window_ms": 30000,
    "recorder_max_bytes": 67108864,
    "start_realtime": False,
    "extra_args": [],
    "env": {},
}

# The value sets every structural check runs over.
VARIANTS = {
    "default": [],
    "preset-gpu": ["--set", "preset=gpu"],
    "preset-tpu": ["--set", "preset=tpu"],
    "cert-manager": ["--set", "certManager.enabled=true"],
    "regular-container-sidecar": ["--set", "sidecar.nativeSidecar=false"],
    "auth-off": ["--set", "auth.enabled=false"],
    "sidecar-tls-off": ["--set", "sidecar.tls.enabled=false"],
    "kube-1.20": ["--kube-version", "1.20.2"],
    "monitoring": ["--set", "serviceMonitor.enabled=true", "--set", "podMonitor.enabled=true",
                   "--set", "grafana.dashboard.enabled=true"],
}


def find_helm():
    """$CLUSTERPROF_HELM, else the newest helm in scripts/install-helm's cache, else PATH."""
    explicit = os.environ.get("CLUSTERPROF_HELM", "")
    if explicit:
        if not os.access(explicit, os.X_OK):
            sys.stderr.write(f"chart_test: CLUSTERPROF_HELM={explicit} is not an executable\n")
            sys.exit(1)
        return explicit
    cache = os.environ.get("CLUSTERPROF_HELM_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "clusterprof")
    cached = sorted(glob.glob(os.path.join(cache, "helm-*", "helm")))
    if cached:
        return cached[-1]
    return shutil.which("helm")


HELM = None


def run_helm(args, check=True):
    result = subprocess.run([HELM] + args, capture_output=True, text=True, timeout=120)
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({result.returncode}):\n"
                             f"{result.stdout}\n{result.stderr}")
    return result


_render_cache = {}


def render(extra=(), include_crds=False):
    """The documents `helm template` renders, as a list of dicts (cached per argument list)."""
    key = (tuple(extra), include_crds)
    if key not in _render_cache:
        args = ["template", RELEASE, CHART, "--namespace", NAMESPACE] + BASE + list(extra)
        if include_crds:
            args.append("--include-crds")
        out = run_helm(args).stdout
        _render_cache[key] = [doc for doc in yaml.safe_load_all(out) if doc]
    return _render_cache[key]


def render_text(extra=()):
    """`helm template`'s output as it is, uncached: every call makes new certificates."""
    args = ["template", RELEASE, CHART, "--namespace", NAMESPACE] + BASE + list(extra)
    return run_helm(args).stdout


def document_text(rendered, kind):
    """The text of the one document of `kind` in `helm template` output."""
    found = [d for d in rendered.split("\n---\n") if re.search(rf"^kind: {kind}$", d, re.M)]
    if len(found) != 1:
        raise AssertionError(f"expected one {kind}, found {len(found)}")
    return found[0]


def of_kind(docs, kind):
    return [d for d in docs if d["kind"] == kind]


def one(docs, kind, name=None):
    found = [d for d in of_kind(docs, kind) if name is None or d["metadata"]["name"] == name]
    if len(found) != 1:
        raise AssertionError(f"expected one {kind} {name or ''}, found {len(found)}")
    return found[0]


def deployment(docs):
    return one(docs, "Deployment")


def operator_container(docs):
    containers = deployment(docs)["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1, containers
    return containers[0]


def injection_config(docs):
    config_map = one(docs, "ConfigMap", f"{RELEASE}-injection")
    return yaml.safe_load(config_map["data"]["config.yaml"])


def openssl(args, stdin=None):
    return subprocess.run(["openssl"] + args, input=stdin, capture_output=True, text=True,
                          timeout=30)


SIDECAR_TLS = "clusterprof-sidecar-tls"
SIDECAR_CA = f"{RELEASE}-sidecar-ca"


def secrets_named(docs, name):
    return [s for s in of_kind(docs, "Secret") if s["metadata"]["name"] == name]


class ChartTest(unittest.TestCase):
    maxDiff = None

    def test_lint_is_clean_for_every_variant(self):
        for name, extra in VARIANTS.items():
            with self.subTest(variant=name):
                result = run_helm(["lint", "--strict", CHART, "--namespace", NAMESPACE] + BASE +
                                  extra, check=False)
                self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
                self.assertIn("0 chart(s) failed", result.stdout)

    def test_chart_crds_are_the_crds_of_crds_dir(self):
        # The chart's copies are byte for byte the source of truth in crds/.
        source = sorted(os.path.basename(p) for p in glob.glob(os.path.join(SOURCE_DIR, "crds",
                                                                          "*.yaml")))
        chart = sorted(os.path.basename(p) for p in glob.glob(os.path.join(CHART, "crds",
                                                                         "*.yaml")))
        self.assertEqual(chart, source)
        self.assertIn("profilejob.yaml", source)
        for name in source:
            with self.subTest(crd=name):
                with open(os.path.join(SOURCE_DIR, "crds", name), "rb") as f:
                    want = f.read()
                with open(os.path.join(CHART, "crds", name), "rb") as f:
                    got = f.read()
                self.assertEqual(got, want, f"helm/clusterprof/crds/{name} differs from "
                                 f"crds/{name}: copy crds/{name} over it")
        crds = of_kind(render(include_crds=True), "CustomResourceDefinition")
        self.assertEqual(sorted(c["metadata"]["name"] for c in crds),
                         ["profilejobs.clusterprof.io", "profileschedules.clusterprof.io",
                          "profiletriggers.clusterprof.io"])

    def test_default_kinds(self):
        kinds = sorted(d["kind"] for d in render())
        self.assertEqual(kinds, sorted([
            "ServiceAccount", "ClusterRole", "ClusterRole", "ClusterRole", "ClusterRoleBinding",
            "Role", "RoleBinding",
            "ConfigMap", "Secret", "Secret", "Secret", "Secret", "Service", "Service", "Deployment",
            "MutatingWebhookConfiguration", "PodDisruptionBudget", "Pod"]))

    def test_every_object_has_the_standard_labels_and_namespace(self):
        cluster_scoped = {"ClusterRole", "ClusterRoleBinding", "MutatingWebhookConfiguration"}
        for name, extra in VARIANTS.items():
            for doc in render(extra):
                with self.subTest(variant=name, kind=doc["kind"], name=doc["metadata"]["name"]):
                    labels = doc["metadata"]["labels"]
                    self.assertEqual(labels["app.kubernetes.io/name"], "clusterprof")
                    self.assertEqual(labels["app.kubernetes.io/instance"], RELEASE)
                    self.assertEqual(labels["app.kubernetes.io/managed-by"], "Helm")
                    self.assertEqual(labels["helm.sh/chart"], "clusterprof-0.1.0")
                    self.assertIn("app.kubernetes.io/component", labels)
                    if doc["kind"] in cluster_scoped:
                        self.assertNotIn("namespace", doc["metadata"])
                    else:
                        self.assertEqual(doc["metadata"]["namespace"], NAMESPACE)

    def test_kube_version_below_1_20_is_refused(self):
        result = run_helm(["template", RELEASE, CHART, "--kube-version", "1.19.9"], check=False)
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("kubeVersion", result.stderr)

    # --- RBAC ----------------------------------------------------------------------------------

    def cluster_role_table(self, docs):
        role = one(docs, "ClusterRole", f"{RELEASE}-operator")
        table = {}
        for rule in role["rules"]:
            self.assertNotIn("resourceNames", rule)
            self.assertNotIn("nonResourceURLs", rule)
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    self.assertNotIn("*", rule["verbs"])
                    key = (group, resource)
                    self.assertNotIn(key, table, f"{key} in two rules")
                    table[key] = set(rule["verbs"])
        return table

    def test_cluster_role_grants_exactly_what_the_operator_uses(self):
        for name, extra in VARIANTS.items():
            with self.subTest(variant=name):
                self.assertEqual(self.cluster_role_table(render(extra)),
                                 EXPECTED_CLUSTER_ROLE_RULES)

    def test_owner_reference_enforcement_adds_schedule_finalizers(self):
        table = self.cluster_role_table(
            render(["--set", "rbac.ownerReferencesPermissionEnforcement=true"]))
        expected = dict(EXPECTED_CLUSTER_ROLE_RULES)
        expected[("clusterprof.io", "profileschedules/finalizers")] = {"update"}
        expected[("clusterprof.io", "profiletriggers/finalizers")] = {"update"}
        self.assertEqual(table, expected)

    def test_cluster_role_is_bound_to_the_service_account(self):
        docs = render()
        account = one(docs, "ServiceAccount")["metadata"]["name"]
        self.assertEqual(deployment(docs)["spec"]["template"]["spec"]["serviceAccountName"],
                         account)
        binding = one(docs, "ClusterRoleBinding")
        self.assertEqual(binding["roleRef"], {"apiGroup": "rbac.authorization.k8s.io",
                                              "kind": "ClusterRole",
                                              "name": f"{RELEASE}-operator"})
        self.assertEqual(binding["subjects"], [{"kind": "ServiceAccount", "name": account,
                                                "namespace": NAMESPACE}])

    def test_leases_are_in_a_role_of_the_release_namespace(self):
        docs = render()
        role = one(docs, "Role")
        self.assertEqual(role["metadata"]["namespace"], NAMESPACE)
        self.assertEqual(role["rules"], EXPECTED_LEASE_RULES)
        binding = one(docs, "RoleBinding")
        self.assertEqual(binding["metadata"]["namespace"], NAMESPACE)
        self.assertEqual(binding["roleRef"]["kind"], "Role")
        self.assertEqual(binding["roleRef"]["name"], role["metadata"]["name"])
        self.assertEqual(binding["subjects"][0]["name"], one(docs, "ServiceAccount")["metadata"]
                         ["name"])
        # The lease name in the Role is the one the operator is told.
        docs = render(["--set", "operator.leaderElection.leaseName=my-lease"])
        self.assertEqual(one(docs, "Role")["rules"][1]["resourceNames"], ["my-lease"])
        self.assertIn("--leader-election-id=my-lease", operator_container(docs)["args"])
        # Without leader election: no Role, no --leader-elect.
        docs = render(["--set", "operator.leaderElection.enabled=false"])
        self.assertEqual(of_kind(docs, "Role"), [])
        self.assertNotIn("--leader-elect", operator_container(docs)["args"])

    def test_watch_namespace_binds_the_role_in_that_namespace_only(self):
        docs = render(["--set", "operator.watchNamespace=training"])
        self.assertEqual(of_kind(docs, "ClusterRoleBinding"), [])
        bindings = [b for b in of_kind(docs, "RoleBinding") if b["roleRef"]["kind"] ==
                    "ClusterRole"]
        self.assertEqual(len(bindings), 1)
        self.assertEqual(bindings[0]["metadata"]["namespace"], "training")
        self.assertIn("--namespace=training", operator_container(docs)["args"])

    # --- Deployment ----------------------------------------------------------------------------

    def test_deployment_flags(self):
        self.assertEqual(operator_container(render())["args"], [
            "--leader-elect",
            "--leader-election-id=clusterprof-operator",
            "--health-port=8081",
            "--webhook-port=9443",
            "--webhook-cert-dir=/etc/clusterprof/webhook",
            "--injection-config=/etc/clusterprof/injection/config.yaml",
            "--sidecar-token-file=/etc/clusterprof/sidecar-token/token",
            "--sidecar-tls-ca-file=/etc/clusterprof/sidecar-ca/ca.crt",
            "--sidecar-tls-server-name=clusterprof-sidecar",
            "--workers=4",
            "--recorder-window-ms=30000",
            "--qps=50",
            "--burst=100",
            "--shutdown-grace-seconds=25",
            "--log-format=json",
            "--log-level=info",
        ])
        args = operator_container(render(["--set", "operator.extraArgs={--fan-out-lead-ms=300}",
                                          "--set", "operator.logLevel=debug"]))["args"]
        self.assertIn("--log-level=debug", args)
        self.assertEqual(args[-1], "--fan-out-lead-ms=300")
        self.assertNotIn("--allow-external-addresses", args)
        args = operator_container(render(["--set", "operator.allowExternalAddresses=true"]))["args"]
        self.assertIn("--allow-external-addresses", args)

    def test_replicas_come_from_values(self):
        self.assertEqual(deployment(render())["spec"]["replicas"], 2)
        docs = render(["--set", "replicas=3"])
        self.assertEqual(deployment(docs)["spec"]["replicas"], 3)
        self.assertEqual(len(of_kind(docs, "PodDisruptionBudget")), 1)
        docs = render(["--set", "replicas=1"])
        self.assertEqual(deployment(docs)["spec"]["replicas"], 1)
        self.assertEqual(of_kind(docs, "PodDisruptionBudget"), [])
        self.assertNotIn("topologySpreadConstraints", deployment(docs)["spec"]["template"]["spec"])

    def test_deployment_env_ports_probes_and_mounts(self):
        docs = render()
        pod = deployment(docs)["spec"]["template"]["spec"]
        container = operator_container(docs)
        env = {e["name"]: e for e in container["env"]}
        self.assertEqual(env["POD_NAMESPACE"]["valueFrom"],
                         {"fieldRef": {"fieldPath": "metadata.namespace"}})
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        self.assertEqual(ports, {"health": 8081, "webhook": 9443})
        self.assertEqual(container["livenessProbe"]["httpGet"], {"path": "/healthz",
                                                                 "port": "health"})
        self.assertEqual(container["readinessProbe"]["httpGet"], {"path": "/readyz",
                                                                  "port": "health"})
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        # Each file flag points into a mounted volume holding the rendered object.
        self.assertEqual(volumes[mounts["/etc/clusterprof/webhook"]]["secret"]["secretName"],
                         f"{RELEASE}-webhook-tls")
        self.assertEqual(volumes[mounts["/etc/clusterprof/injection"]]["configMap"]["name"],
                         f"{RELEASE}-injection")
        self.assertEqual(volumes[mounts["/etc/clusterprof/sidecar-token"]]["secret"]
                         ["secretName"], "clusterprof-sidecar-token")
        self.assertEqual({i["path"] for i in volumes[mounts["/etc/clusterprof/webhook"]]
                          ["secret"]["items"]}, {"tls.crt", "tls.key"})
        # The sidecars' CA, and not their key, from the release namespace's serving Secret.
        self.assertEqual(volumes[mounts["/etc/clusterprof/sidecar-ca"]]["secret"],
                         {"secretName": SIDECAR_TLS, "items": [{"key": "ca.crt",
                                                                "path": "ca.crt"}]})
        # No mount of a Secret uses subPath, which the kubelet never updates: rotated Secrets
        # reach the running operator.
        for mount in container["volumeMounts"]:
            self.assertNotIn("subPath", mount)
            self.assertNotIn("subPathExpr", mount)
        # Writable scratch for a read-only root filesystem.
        self.assertIn("/tmp", mounts)
        self.assertEqual(pod["terminationGracePeriodSeconds"], 30)
        spread = pod["topologySpreadConstraints"]
        self.assertEqual(spread[0]["topologyKey"], "kubernetes.io/hostname")
        self.assertEqual(spread[0]["labelSelector"]["matchLabels"],
                         deployment(docs)["spec"]["selector"]["matchLabels"])
        # The injection config's checksum rolls the pods when it changes.
        checksum = deployment(docs)["spec"]["template"]["metadata"]["annotations"][
            "checksum/injection-config"]
        other = deployment(render(["--set", "sidecar.port=9000"]))["spec"]["template"][
            "metadata"]["annotations"]["checksum/injection-config"]
        self.assertNotEqual(checksum, other)

    def test_scheduling_values(self):
        docs = render(["--set", "nodeSelector.pool=system",
                       "--set", "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
                       ".nodeSelectorTerms[0].matchExpressions[0].key=pool",
                       "--set", "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
                       ".nodeSelectorTerms[0].matchExpressions[0].operator=Exists",
                       "--set", "resources.limits.memory=1Gi",
                       "--set", "priorityClassName=system-cluster-critical"])
        pod = deployment(docs)["spec"]["template"]["spec"]
        self.assertEqual(pod["nodeSelector"], {"pool": "system"})
        self.assertIn("nodeAffinity", pod["affinity"])
        self.assertEqual(pod["priorityClassName"], "system-cluster-critical")
        self.assertEqual(operator_container(docs)["resources"]["limits"]["memory"], "1Gi")

    def test_every_pod_and_container_is_locked_down(self):
        for name, extra in VARIANTS.items():
            for doc in render(extra):
                if "template" not in doc.get("spec", {}):
                    continue
                pod = doc["spec"]["template"]["spec"]
                with self.subTest(variant=name, kind=doc["kind"]):
                    security = pod["securityContext"]
                    self.assertIs(security["runAsNonRoot"], True)
                    self.assertEqual(security["runAsUser"], 65532)
                    self.assertEqual(security["seccompProfile"], {"type": "RuntimeDefault"})
                    containers = pod.get("containers", []) + pod.get("initContainers", [])
                    self.assertTrue(containers)
                    for container in containers:
                        context = container["securityContext"]
                        self.assertIs(context["readOnlyRootFilesystem"], True)
                        self.assertIs(context["allowPrivilegeEscalation"], False)
                        self.assertIs(context["runAsNonRoot"], True)
                        self.assertEqual(context["capabilities"], {"drop": ["ALL"]})
                        self.assertNotIn("privileged", {k for k, v in context.items() if v is
                                                        True})

    def test_presets_set_tolerations_and_user_values_win(self):
        tolerations = lambda docs: deployment(docs)["spec"]["template"]["spec"].get(
            "tolerations", [])
        self.assertEqual(tolerations(render()), [])
        self.assertEqual([t["key"] for t in tolerations(render(["--set", "preset=gpu"]))],
                         ["nvidia.com/gpu"])
        self.assertEqual([t["key"] for t in tolerations(render(["--set", "preset=tpu"]))],
                         ["google.com/tpu"])
        docs = render(["--set", "preset=gpu", "--set", "tolerations[0].key=dedicated",
                       "--set", "tolerations[0].operator=Exists"])
        self.assertEqual(tolerations(docs), [{"key": "dedicated", "operator": "Exists"}])

    # --- Webhook -------------------------------------------------------------------------------

    def test_mutating_webhook_configuration(self):
        for name, extra in VARIANTS.items():
            docs = render(extra)
            config = one(docs, "MutatingWebhookConfiguration")
            service = one(docs, "Service", f"{RELEASE}-webhook")
            with self.subTest(variant=name):
                webhooks = config["webhooks"]
                self.assertEqual([w["name"] for w in webhooks],
                                 ["pod-label.sidecar.clusterprof.io",
                                  "namespace-label.sidecar.clusterprof.io"])
                for webhook in webhooks:
                    self.assertEqual(webhook["admissionReviewVersions"], ["v1"])
                    self.assertEqual(webhook["sideEffects"], "None")
                    self.assertEqual(webhook["failurePolicy"], "Ignore")
                    self.assertEqual(webhook["timeoutSeconds"], 5)
                    self.assertEqual(webhook["reinvocationPolicy"], "Never")
                    self.assertEqual(webhook["clientConfig"]["service"], {
                        "name": service["metadata"]["name"], "namespace": NAMESPACE,
                        "path": "/mutate-pods", "port": 443})
                    self.assertEqual(webhook["rules"], [{
                        "operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                        "resources": ["pods"], "scope": "Namespaced"}])
                    excluded = [e for e in webhook["namespaceSelector"]["matchExpressions"]
                                if e["key"] == "kubernetes.io/metadata.name"]
                    self.assertEqual(excluded, [{"key": "kubernetes.io/metadata.name",
                                                 "operator": "NotIn",
                                                 "values": ["kube-system", NAMESPACE]}])
                by_pod, by_namespace = webhooks
                self.assertEqual(by_pod["objectSelector"],
                                 {"matchLabels": {"clusterprof.io/inject": "true"}})
                self.assertIn({"key": "clusterprof.io/inject", "operator": "In",
                               "values": ["true"]},
                              by_namespace["namespaceSelector"]["matchExpressions"])
                opt_out = by_namespace["objectSelector"]["matchExpressions"]
                self.assertEqual(len(opt_out), 1)
                self.assertEqual(opt_out[0]["operator"], "NotIn")
                self.assertIn("false", opt_out[0]["values"])
        # The Service reaches the container's webhook port.
        docs = render()
        port = one(docs, "Service", f"{RELEASE}-webhook")["spec"]["ports"][0]
        self.assertEqual(port["port"], 443)
        self.assertEqual(port["targetPort"], "webhook")
        self.assertEqual(one(docs, "Service", f"{RELEASE}-webhook")["spec"]["selector"],
                         deployment(docs)["spec"]["selector"]["matchLabels"])
        # failurePolicy, timeout and exclusions are values.
        docs = render(["--set", "webhook.failurePolicy=Fail", "--set", "webhook.timeoutSeconds=3",
                       "--set", "webhook.excludeNamespaces={monitoring}"])
        webhook = one(docs, "MutatingWebhookConfiguration")["webhooks"][0]
        self.assertEqual(webhook["failurePolicy"], "Fail")
        self.assertEqual(webhook["timeoutSeconds"], 3)
        self.assertIn("monitoring", webhook["namespaceSelector"]["matchExpressions"][0]["values"])

    def test_generated_certificate_is_signed_by_the_ca_bundle(self):
        for name, extra in VARIANTS.items():
            if name == "cert-manager":
                continue
            docs = render(extra)
            with self.subTest(variant=name):
                secret = one(docs, "Secret", f"{RELEASE}-webhook-tls")
                self.assertEqual(secret["type"], "kubernetes.io/tls")
                bundles = {w["clientConfig"]["caBundle"] for w in
                           one(docs, "MutatingWebhookConfiguration")["webhooks"]}
                self.assertEqual(len(bundles), 1)
                bundle = bundles.pop()
                self.assertEqual(secret["data"]["ca.crt"], bundle)
                ca = base64.b64decode(bundle).decode()
                cert = base64.b64decode(secret["data"]["tls.crt"]).decode()
                key = base64.b64decode(secret["data"]["tls.key"]).decode()
                self.assertTrue(ca.startswith("-----BEGIN CERTIFICATE-----"), ca[:40])
                self.verify_certificate(ca, cert, key)

    def verify_certificate(self, ca_pem, cert_pem, key_pem):
        with tempfile.TemporaryDirectory() as tmp:
            ca_file = os.path.join(tmp, "ca.crt")
            cert_file = os.path.join(tmp, "tls.crt")
            with open(ca_file, "w") as f:
                f.write(ca_pem)
            with open(cert_file, "w") as f:
                f.write(cert_pem)
            # A CA...
            text = openssl(["x509", "-noout", "-text", "-in", ca_file]).stdout
            self.assertRegex(text, r"CA:TRUE")
            # ...that signed the serving certificate, good for a TLS server...
            verified = openssl(["verify", "-CAfile", ca_file, "-purpose", "sslserver",
                                cert_file])
            self.assertEqual(verified.returncode, 0, verified.stdout + verified.stderr)
            self.assertIn(": OK", verified.stdout)
            # ...named for the webhook Service.
            sans = openssl(["x509", "-noout", "-ext", "subjectAltName", "-in", cert_file]).stdout
            svc = f"{RELEASE}-webhook"
            for dns in [svc, f"{svc}.{NAMESPACE}", f"{svc}.{NAMESPACE}.svc",
                        f"{svc}.{NAMESPACE}.svc.cluster.local"]:
                self.assertIn(f"DNS:{dns}", re.findall(r"DNS:[^,\s]+", sans))
            # The key is the certificate's.
            cert_pub = openssl(["x509", "-noout", "-pubkey", "-in", cert_file]).stdout
            key_pub = openssl(["pkey", "-pubout"], stdin=key_pem).stdout
            self.assertTrue(cert_pub)
            self.assertEqual(cert_pub, key_pub)

    def test_cert_manager_issues_the_certificate_and_injects_the_ca(self):
        docs = render(["--set", "certManager.enabled=true"])
        self.assertEqual([s["metadata"]["name"] for s in of_kind(docs, "Secret")],
                         ["clusterprof-sidecar-token"])
        issuer = one(docs, "Issuer", f"{RELEASE}-selfsigned")
        self.assertEqual(issuer["spec"], {"selfSigned": {}})
        certificate = one(docs, "Certificate", f"{RELEASE}-webhook-tls")
        self.assertEqual(certificate["spec"]["secretName"], f"{RELEASE}-webhook-tls")
        self.assertEqual(certificate["spec"]["issuerRef"], {"kind": "Issuer",
                                                            "name": issuer["metadata"]["name"]})
        self.assertIn(f"{RELEASE}-webhook.{NAMESPACE}.svc", certificate["spec"]["dnsNames"])
        config = one(docs, "MutatingWebhookConfiguration")
        self.assertEqual(config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
                         f"{NAMESPACE}/{certificate['metadata']['name']}")
        for webhook in config["webhooks"]:
            self.assertNotIn("caBundle", webhook["clientConfig"])
        # The Deployment mounts the Secret cert-manager writes.
        volumes = deployment(docs)["spec"]["template"]["spec"]["volumes"]
        self.assertIn(f"{RELEASE}-webhook-tls",
                      [v.get("secret", {}).get("secretName") for v in volumes])
        # An issuer of the user's: no Issuer rendered.
        docs = render(["--set", "certManager.enabled=true",
                       "--set", "certManager.issuerRef.kind=ClusterIssuer",
                       "--set", "certManager.issuerRef.name=corp-ca"])
        self.assertEqual(of_kind(docs, "Issuer"), [])
        self.assertEqual(one(docs, "Certificate", f"{RELEASE}-webhook-tls")["spec"]["issuerRef"],
                         {"kind": "ClusterIssuer", "name": "corp-ca"})

    # --- Injection config and token ------------------------------------------------------------

    def test_injection_config_follows_the_values(self):
        self.assertEqual(injection_config(render()), DEFAULT_INJECTION_CONFIG)

        gpu = injection_config(render(["--set", "preset=gpu"]))
        self.assertEqual(gpu["gpu_library"], "/usr/lib/clusterprof/libclusterprof_cupti.so")
        self.assertEqual(gpu["framework_profiler"], "")
        self.assertEqual(gpu["resources"]["limits"]["memory"], "2Gi")

        tpu = injection_config(render(["--set", "preset=tpu"]))
        self.assertEqual(tpu["gpu_library"], "")
        self.assertEqual(tpu["framework_profiler"], "localhost:9012")

        # A value set by the user wins over the preset, "" included.
        tpu = injection_config(render(["--set", "preset=tpu",
                                       "--set", "sidecar.frameworkProfiler=localhost:9999",
                                       "--set", "sidecar.gpuLibrary=/opt/cupti.so"]))
        self.assertEqual(tpu["framework_profiler"], "localhost:9999")
        self.assertEqual(tpu["gpu_library"], "/opt/cupti.so")
        gpu = injection_config(render(["--set", "preset=gpu", "--set", "sidecar.gpuLibrary="]))
        self.assertEqual(gpu["gpu_library"], "")

        self.assertIs(injection_config(render(["--set", "sidecar.nativeSidecar=false"]))
                      ["native_sidecar"], False)

        custom = injection_config(render([
            "--set", "sidecar.image.repository=mirror.example/clusterprof/sidecar",
            "--set", "sidecar.image.tag=0.1.1",
            "--set", "sidecar.image.pullPolicy=Always",
            "--set", "sidecar.port=9466", "--set", "sidecar.httpPort=9467",
            "--set", "sidecar.allowedLogdirs={gs://bucket/tb,/data/profiles}",
            "--set", "sidecar.extraArgs={--log-level=debug}",
            "--set", "sidecar.extraEnv.HTTPS_PROXY=http://proxy:3128",
            "--set", "sidecar.resources.requests.cpu=50m",
        ]))
        self.assertEqual(custom["image"], "mirror.example/clusterprof/sidecar:0.1.1")
        self.assertEqual(custom["image_pull_policy"], "Always")
        self.assertEqual((custom["port"], custom["http_port"]), (9466, 9467))
        self.assertEqual(custom["allowed_logdirs"], ["gs://bucket/tb", "/data/profiles"])
        self.assertEqual(custom["extra_args"], ["--log-level=debug"])
        self.assertEqual(custom["env"], {"HTTPS_PROXY": "http://proxy:3128"})
        self.assertEqual(custom["resources"], {"requests": {"cpu": "50m"}})
        # Every key is one the operator knows.
        self.assertEqual(set(custom), set(DEFAULT_INJECTION_CONFIG))

    def test_preset_files_are_usable_as_values_files(self):
        for preset in ["none", "gpu", "tpu"]:
            with self.subTest(preset=preset):
                by_name = render(["--set", f"preset={preset}"])
                by_file = render(["-f", os.path.join(CHART, "presets", f"{preset}.yaml")])
                self.assertEqual(injection_config(by_file), injection_config(by_name))

    def test_token_secret(self):
        docs = render(["--set", "auth.namespaces={training,serving}"])
        secrets = [s for s in of_kind(docs, "Secret")
                   if s["metadata"]["name"] == "clusterprof-sidecar-token"]
        self.assertEqual(sorted(s["metadata"]["namespace"] for s in secrets),
                         sorted([NAMESPACE, "training", "serving"]))
        tokens = {s["data"]["token"] for s in secrets}
        self.assertEqual(len(tokens), 1, "one token in every namespace")
        token = base64.b64decode(tokens.pop()).decode()
        self.assertGreaterEqual(len(token), 32)
        self.assertRegex(token, r"^[A-Za-z0-9]+$")
        self.assertEqual(injection_config(docs)["token_secret"], "clusterprof-sidecar-token")

    def test_existing_token_secret(self):
        docs = render(["--set", "auth.existingSecret=my-token"])
        self.assertEqual(sorted(s["metadata"]["name"] for s in of_kind(docs, "Secret")),
                         sorted([f"{RELEASE}-webhook-tls", SIDECAR_CA, SIDECAR_TLS]))
        self.assertEqual(injection_config(docs)["token_secret"], "my-token")
        volumes = deployment(docs)["spec"]["template"]["spec"]["volumes"]
        self.assertIn("my-token", [v.get("secret", {}).get("secretName") for v in volumes])
        self.assertIn("--sidecar-token-file=/etc/clusterprof/sidecar-token/token",
                      operator_container(docs)["args"])

    def test_auth_off(self):
        docs = render(["--set", "auth.enabled=false"])
        self.assertEqual(sorted(s["metadata"]["name"] for s in of_kind(docs, "Secret")),
                         sorted([f"{RELEASE}-webhook-tls", SIDECAR_CA, SIDECAR_TLS]))
        self.assertEqual(injection_config(docs)["token_secret"], "")
        self.assertFalse([a for a in operator_container(docs)["args"]
                          if a.startswith("--sidecar-token-file")])
        self.assertNotIn("/etc/clusterprof/sidecar-token",
                         [m["mountPath"] for m in operator_container(docs)["volumeMounts"]])

    # --- Sidecar TLS and rotation --------------------------------------------------------------

    def test_sidecar_tls_secret_is_in_the_release_and_every_auth_namespace(self):
        docs = render(["--set", "auth.namespaces={training,serving}"])
        serving = secrets_named(docs, SIDECAR_TLS)
        self.assertEqual(sorted(s["metadata"]["namespace"] for s in serving),
                         sorted([NAMESPACE, "training", "serving"]))
        for secret in serving:
            self.assertEqual(secret["type"], "kubernetes.io/tls")
            self.assertEqual(set(secret["data"]), {"tls.crt", "tls.key", "ca.crt"})
            self.assertEqual(secret["data"], serving[0]["data"], "one certificate everywhere")
        # The CA's key is in one Secret of the release namespace, and nowhere else.
        [ca] = secrets_named(docs, SIDECAR_CA)
        self.assertEqual(ca["metadata"]["namespace"], NAMESPACE)
        self.assertEqual(ca["type"], "kubernetes.io/tls")
        self.assertEqual(set(ca["data"]), {"tls.crt", "tls.key"})
        self.assertEqual(serving[0]["data"]["ca.crt"], ca["data"]["tls.crt"])
        ca_key = ca["data"]["tls.key"]
        self.assertIn("PRIVATE KEY", base64.b64decode(ca_key).decode())
        holders = [f"{d['kind']} {d['metadata'].get('namespace')}/{d['metadata']['name']}"
                   for d in docs if ca_key in yaml.safe_dump(d)
                   or base64.b64decode(ca_key).decode().strip() in yaml.safe_dump(d)]
        self.assertEqual(holders, [f"Secret {NAMESPACE}/{SIDECAR_CA}"])
        # The webhook mounts the Secret into the sidecars; the operator trusts its ca.crt.
        self.assertEqual(injection_config(docs)["tls_secret"], SIDECAR_TLS)

    def check_sidecar_certificate(self, secret, server_name, days):
        """The serving certificate names server_name only, verifies against ca.crt for a TLS
        server, holds an ECDSA key that is its own, and is valid for `days`."""
        with tempfile.TemporaryDirectory() as tmp:
            paths = {}
            for key in ["tls.crt", "tls.key", "ca.crt"]:
                paths[key] = os.path.join(tmp, key)
                with open(paths[key], "wb") as f:
                    f.write(base64.b64decode(secret["data"][key]))
            self.assertRegex(openssl(["x509", "-noout", "-text", "-in", paths["ca.crt"]]).stdout,
                             r"CA:TRUE")
            verified = openssl(["verify", "-CAfile", paths["ca.crt"], "-purpose", "sslserver",
                                paths["tls.crt"]])
            self.assertEqual(verified.returncode, 0, verified.stdout + verified.stderr)
            self.assertIn(": OK", verified.stdout)
            sans = openssl(["x509", "-noout", "-ext", "subjectAltName",
                            "-in", paths["tls.crt"]]).stdout
            self.assertEqual(re.findall(r"(?:DNS|IP Address):[^,\s]+", sans),
                             [f"DNS:{server_name}"])
            text = openssl(["x509", "-noout", "-text", "-in", paths["tls.crt"]]).stdout
            self.assertIn("id-ecPublicKey", text)
            self.assertIn("TLS Web Server Authentication", text)
            cert_pub = openssl(["x509", "-noout", "-pubkey", "-in", paths["tls.crt"]]).stdout
            key_pub = openssl(["pkey", "-pubout", "-in", paths["tls.key"]]).stdout
            self.assertTrue(cert_pub)
            self.assertEqual(cert_pub, key_pub)
            # Valid `days` from now: not after then, and still a day before.
            self.assertEqual(openssl(["x509", "-noout", "-checkend", str((days - 1) * 86400),
                                      "-in", paths["tls.crt"]]).returncode, 0)
            self.assertNotEqual(openssl(["x509", "-noout", "-checkend", str((days + 1) * 86400),
                                         "-in", paths["tls.crt"]]).returncode, 0)

    def test_sidecar_certificate_names_the_server_and_verifies_against_the_ca(self):
        [secret] = secrets_named(render(), SIDECAR_TLS)
        self.check_sidecar_certificate(secret, "clusterprof-sidecar", 365)
        # Another name and lifetime: the certificate and the operator's flag follow.
        docs = render(["--set", "sidecar.tls.serverName=profiler.internal",
                       "--set", "sidecar.tls.validityDays=30"])
        [secret] = secrets_named(docs, SIDECAR_TLS)
        self.check_sidecar_certificate(secret, "profiler.internal", 30)
        self.assertIn("--sidecar-tls-server-name=profiler.internal",
                      operator_container(docs)["args"])

    def test_sidecar_tls_off_renders_no_certificate_and_no_tls_setting(self):
        docs = render(["--set", "sidecar.tls.enabled=false", "--set", "auth.namespaces={training}"])
        self.assertEqual(secrets_named(docs, SIDECAR_TLS), [])
        self.assertEqual(secrets_named(docs, SIDECAR_CA), [])
        self.assertFalse([a for a in operator_container(docs)["args"]
                          if a.startswith("--sidecar-tls-")])
        self.assertNotIn("/etc/clusterprof/sidecar-ca",
                         [m["mountPath"] for m in operator_container(docs)["volumeMounts"]])
        config = injection_config(docs)
        self.assertNotIn("tls_secret", config)
        self.assertEqual(config["token_grace_seconds"], 300)
        # cert-manager renders no sidecar Certificate either.
        docs = render(["--set", "sidecar.tls.enabled=false", "--set", "certManager.enabled=true"])
        self.assertEqual([c["metadata"]["name"] for c in of_kind(docs, "Certificate")],
                         [f"{RELEASE}-webhook-tls"])

    def test_sidecar_tls_existing_secret_is_used_as_it_is(self):
        docs = render(["--set", "sidecar.tls.existingSecret=corp-sidecar-tls",
                       "--set", "auth.namespaces={training}"])
        self.assertEqual(secrets_named(docs, SIDECAR_TLS), [])
        self.assertEqual(secrets_named(docs, SIDECAR_CA), [])
        self.assertEqual(injection_config(docs)["tls_secret"], "corp-sidecar-tls")
        volumes = {v["name"]: v for v in deployment(docs)["spec"]["template"]["spec"]["volumes"]}
        self.assertEqual(volumes["sidecar-ca"]["secret"]["secretName"], "corp-sidecar-tls")
        self.assertIn("--sidecar-tls-ca-file=/etc/clusterprof/sidecar-ca/ca.crt",
                      operator_container(docs)["args"])
        # With cert-manager too: no Certificate for it.
        docs = render(["--set", "sidecar.tls.existingSecret=corp-sidecar-tls",
                       "--set", "certManager.enabled=true"])
        self.assertEqual([c["metadata"]["name"] for c in of_kind(docs, "Certificate")],
                         [f"{RELEASE}-webhook-tls"])

    def test_cert_manager_issues_the_sidecar_certificate_in_every_namespace(self):
        docs = render(["--set", "certManager.enabled=true",
                       "--set", "certManager.issuerRef.kind=ClusterIssuer",
                       "--set", "certManager.issuerRef.name=corp-ca",
                       "--set", "auth.namespaces={training,serving}"])
        self.assertEqual(secrets_named(docs, SIDECAR_TLS), [], "cert-manager writes them")
        certificates = [c for c in of_kind(docs, "Certificate")
                        if c["metadata"]["name"] == SIDECAR_TLS]
        self.assertEqual(sorted(c["metadata"]["namespace"] for c in certificates),
                         sorted([NAMESPACE, "training", "serving"]))
        for certificate in certificates:
            spec = certificate["spec"]
            self.assertEqual(spec["secretName"], SIDECAR_TLS)
            self.assertEqual(spec["dnsNames"], ["clusterprof-sidecar"])
            self.assertEqual(spec["privateKey"]["algorithm"], "ECDSA")
            self.assertEqual(spec["privateKey"]["size"], 256)
            self.assertIn("server auth", spec["usages"])
            self.assertEqual(spec["issuerRef"], {"kind": "ClusterIssuer", "name": "corp-ca"})
        # The operator trusts the ca.crt cert-manager writes into the release namespace's Secret.
        volumes = {v["name"]: v for v in deployment(docs)["spec"]["template"]["spec"]["volumes"]}
        self.assertEqual(volumes["sidecar-ca"]["secret"]["secretName"], SIDECAR_TLS)
        # A namespaced Issuer cannot sign in the workload namespaces: refused, saying what to do.
        for issuer in [[], ["--set", "certManager.issuerRef.kind=Issuer",
                            "--set", "certManager.issuerRef.name=team-ca"]]:
            result = run_helm(["template", RELEASE, CHART, "--namespace", NAMESPACE] + BASE +
                              ["--set", "certManager.enabled=true",
                               "--set", "auth.namespaces={training}"] + issuer, check=False)
            self.assertNotEqual(result.returncode, 0, result.stdout[:200])
            self.assertIn("needs certManager.issuerRef.kind: ClusterIssuer", result.stderr)
            self.assertIn("(training)", result.stderr)
        # The chart's own issuer, release namespace only: a CA of its own signs the certificate,
        # so that ca.crt is a CA and not the certificate itself.
        docs = render(["--set", "certManager.enabled=true"])
        ca = one(docs, "Certificate", SIDECAR_CA)
        self.assertIs(ca["spec"]["isCA"], True)
        self.assertEqual(ca["spec"]["issuerRef"], {"kind": "Issuer",
                                                   "name": f"{RELEASE}-selfsigned"})
        self.assertEqual(one(docs, "Issuer", SIDECAR_CA)["spec"],
                         {"ca": {"secretName": ca["spec"]["secretName"]}})
        self.assertEqual(one(docs, "Certificate", SIDECAR_TLS)["spec"]["issuerRef"],
                         {"kind": "Issuer", "name": SIDECAR_CA})

    def test_rotating_the_token_or_the_certificates_restarts_no_pod(self):
        # Each render makes a new CA, certificates and, without auth.token, token: the operator's
        # Deployment must not change with them (no checksum of those Secrets), so that
        # `helm upgrade` with a new token or certificate rolls no pod.
        first = render_text(["--set", "auth.token=" + "a" * 48, "--set", "auth.namespaces={t1}"])
        second = render_text(["--set", "auth.token=" + "b" * 48, "--set", "auth.namespaces={t1}",
                              "--set", "sidecar.tls.renew=true"])
        docs = lambda text: [d for d in yaml.safe_load_all(text) if d]
        tokens = lambda text: {base64.b64decode(s["data"]["token"]).decode()
                               for s in secrets_named(docs(text), "clusterprof-sidecar-token")}
        self.assertEqual(tokens(first), {"a" * 48})
        self.assertEqual(tokens(second), {"b" * 48})
        certificates = lambda text: {s["data"]["tls.crt"]
                                     for s in secrets_named(docs(text), SIDECAR_TLS)}
        self.assertEqual(len(certificates(first)), 1)
        self.assertNotEqual(certificates(first), certificates(second))
        self.assertEqual(document_text(first, "Deployment"), document_text(second, "Deployment"))
        # So does the injection config, whose checksum is the pod template's only annotation.
        self.assertEqual(document_text(first, "ConfigMap"), document_text(second, "ConfigMap"))
        annotations = deployment(render())["spec"]["template"]["metadata"]["annotations"]
        self.assertEqual(list(annotations), ["checksum/injection-config"])

    def test_auth_token_and_grace(self):
        docs = render(["--set", "auth.token=0123456789abcdef0123", "--set", "auth.namespaces={t1}",
                       "--set", "auth.tokenGraceSeconds=60"])
        secrets = secrets_named(docs, "clusterprof-sidecar-token")
        self.assertEqual(len(secrets), 2)
        for secret in secrets:
            self.assertEqual(base64.b64decode(secret["data"]["token"]).decode(),
                             "0123456789abcdef0123")
        self.assertEqual(injection_config(docs)["token_grace_seconds"], 60)
        self.assertEqual(injection_config(render(["--set", "auth.tokenGraceSeconds=0"]))
                         ["token_grace_seconds"], 0)

    # --- NetworkPolicy, metrics, PDB -----------------------------------------------------------

    def test_network_policy(self):
        self.assertEqual(of_kind(render(), "NetworkPolicy"), [], "no namespaces, no policy")
        docs = render(["--set", "networkPolicy.namespaces={training,serving}"])
        policies = of_kind(docs, "NetworkPolicy")
        self.assertEqual(sorted(p["metadata"]["namespace"] for p in policies),
                         ["serving", "training"])
        operator_labels = deployment(docs)["spec"]["template"]["metadata"]["labels"]
        for policy in policies:
            spec = policy["spec"]
            # Every pod the webhook injected (it sets this label).
            self.assertEqual(spec["podSelector"],
                             {"matchLabels": {"clusterprof.io/injected": "true"}})
            self.assertEqual(spec["policyTypes"], ["Ingress"])
            self.assertEqual(len(spec["ingress"]), 2)
            rule = spec["ingress"][0]
            self.assertEqual(rule["ports"], [{"protocol": "TCP", "port": 8466}])
            self.assertEqual(len(rule["from"]), 1)
            peer = rule["from"][0]
            self.assertEqual(peer["namespaceSelector"],
                             {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}})
            # The peer selects the operator's pods.
            for key, value in peer["podSelector"]["matchLabels"].items():
                self.assertEqual(operator_labels.get(key), value, key)
            # Every other port stays open to everyone: the sidecar port is the only one
            # restricted.
            others = spec["ingress"][1]
            self.assertNotIn("from", others)
            self.assertEqual(others["ports"], [
                {"protocol": "TCP", "port": 1, "endPort": 8465},
                {"protocol": "TCP", "port": 8467, "endPort": 65535},
                {"protocol": "UDP", "port": 1, "endPort": 65535},
                {"protocol": "SCTP", "port": 1, "endPort": 65535}])
        # It follows the sidecar port; extra rules are appended; it can be turned off.
        docs = render(["--set", "networkPolicy.namespaces={training}", "--set", "sidecar.port=9466",
                       "--set", "networkPolicy.admitOtherPorts=false",
                       "--set", "networkPolicy.extraIngress[0].ports[0].port=8467"])
        ingress = one(docs, "NetworkPolicy")["spec"]["ingress"]
        self.assertEqual(ingress[0]["ports"], [{"protocol": "TCP", "port": 9466}])
        self.assertEqual(ingress[1], {"ports": [{"port": 8467}]})
        self.assertEqual(len(ingress), 2)
        # Port ranges need 1.25: older clusters are told what to do instead.
        result = run_helm(["template", RELEASE, CHART, "--namespace", NAMESPACE] + BASE +
                          ["--kube-version", "1.24.0", "--set",
                           "networkPolicy.namespaces={training}"], check=False)
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("networkPolicy.admitOtherPorts needs Kubernetes 1.25+", result.stderr)
        docs = render(["--set", "networkPolicy.namespaces={training}",
                       "--set", "networkPolicy.enabled=false"])
        self.assertEqual(of_kind(docs, "NetworkPolicy"), [])

    def test_service_monitor_only_when_enabled(self):
        docs = render()
        self.assertEqual(of_kind(docs, "ServiceMonitor"), [])
        metrics = one(docs, "Service", f"{RELEASE}-metrics")
        self.assertEqual(metrics["spec"]["ports"], [{"name": "http-metrics", "port": 8081,
                                                     "targetPort": "health", "protocol": "TCP"}])
        docs = render(["--set", "serviceMonitor.enabled=true",
                       "--set", "serviceMonitor.labels.release=prometheus"])
        monitor = one(docs, "ServiceMonitor")
        self.assertEqual(monitor["apiVersion"], "monitoring.coreos.com/v1")
        self.assertEqual(monitor["metadata"]["labels"]["release"], "prometheus")
        self.assertEqual(monitor["spec"]["endpoints"][0]["port"], "http-metrics")
        self.assertEqual(monitor["spec"]["endpoints"][0]["path"], "/metrics")
        metrics = one(docs, "Service", f"{RELEASE}-metrics")
        for key, value in monitor["spec"]["selector"]["matchLabels"].items():
            self.assertEqual(metrics["metadata"]["labels"].get(key), value, key)
        # Only the metrics Service matches, not the webhook's.
        webhook = one(docs, "Service", f"{RELEASE}-webhook")
        self.assertFalse(all(webhook["metadata"]["labels"].get(k) == v for k, v in
                             monitor["spec"]["selector"]["matchLabels"].items()))

    def test_pod_monitor_scrapes_the_injected_sidecars_only_when_enabled(self):
        self.assertEqual(of_kind(render(), "PodMonitor"), [])
        docs = render(["--set", "podMonitor.enabled=true",
                       "--set", "podMonitor.labels.release=prometheus"])
        monitor = one(docs, "PodMonitor")
        self.assertEqual(monitor["apiVersion"], "monitoring.coreos.com/v1")
        self.assertEqual(monitor["metadata"]["name"], f"{RELEASE}-sidecars")
        self.assertEqual(monitor["metadata"]["labels"]["release"], "prometheus")
        # The pods the webhook injected (the label it sets, which the NetworkPolicy selects too),
        # in every namespace, on the sidecar's named HTTP port.
        self.assertEqual(monitor["spec"]["selector"],
                         {"matchLabels": {"clusterprof.io/injected": "true"}})
        self.assertEqual(monitor["spec"]["namespaceSelector"], {"any": True})
        [endpoint] = monitor["spec"]["podMetricsEndpoints"]
        self.assertEqual(endpoint, {"port": "cprof-http", "path": "/metrics", "interval": "30s",
                                    "scrapeTimeout": "10s"})
        with open(os.path.join(SOURCE_DIR, "operator", "webhook", "injection.cc")) as f:
            self.assertIn('Str("cprof-http")', f.read(),
                          "the webhook no longer names the sidecar's HTTP port cprof-http")
        docs = render(["--set", "podMonitor.enabled=true",
                       "--set", "podMonitor.namespaces={training,serving}"])
        self.assertEqual(one(docs, "PodMonitor")["spec"]["namespaceSelector"],
                         {"matchNames": ["training", "serving"]})

    def test_grafana_dashboard_only_when_enabled(self):
        name = f"{RELEASE}-dashboard"
        self.assertEqual([d for d in of_kind(render(), "ConfigMap")
                          if d["metadata"]["name"] == name], [])
        docs = render(["--set", "grafana.dashboard.enabled=true"])
        config_map = one(docs, "ConfigMap", name)
        self.assertEqual(config_map["metadata"]["namespace"], NAMESPACE)
        # The grafana and kube-prometheus-stack charts' sidecar loads ConfigMaps labelled so.
        self.assertEqual(config_map["metadata"]["labels"]["grafana_dashboard"], "1")
        self.assertNotIn("annotations", config_map["metadata"])
        self.assertEqual(list(config_map["data"]), ["clusterprof.json"])
        dashboard = json.loads(config_map["data"]["clusterprof.json"])
        with open(os.path.join(CHART, "dashboards", "clusterprof.json")) as f:
            self.assertEqual(dashboard, json.load(f))
        self.assertEqual(dashboard["uid"], "clusterprof")
        variables = {v["name"]: v for v in dashboard["templating"]["list"]}
        self.assertEqual(variables["datasource"]["type"], "datasource")
        self.assertEqual(variables["datasource"]["query"], "prometheus")
        exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
        self.assertIn("clusterprof_operator_upload_failures_total", "".join(exprs))
        self.assertIn("clusterprof_operator_queue_wait_seconds_bucket", "".join(exprs))
        # Another sidecar label, namespace and folder.
        docs = render(["--set", "grafana.dashboard.enabled=true",
                       "--set", "grafana.dashboard.label=example.com/dashboard",
                       "--set-string", "grafana.dashboard.labelValue=true",
                       "--set", "grafana.dashboard.namespace=monitoring",
                       "--set", "grafana.dashboard.annotations.grafana_folder=Profiling"])
        config_map = one(docs, "ConfigMap", name)
        self.assertEqual(config_map["metadata"]["namespace"], "monitoring")
        self.assertEqual(config_map["metadata"]["labels"]["example.com/dashboard"], "true")
        self.assertNotIn("grafana_dashboard", config_map["metadata"]["labels"])
        self.assertEqual(config_map["metadata"]["annotations"], {"grafana_folder": "Profiling"})
        json.loads(config_map["data"]["clusterprof.json"])

    def test_pod_disruption_budget_api_follows_the_cluster(self):
        self.assertEqual(one(render(), "PodDisruptionBudget")["apiVersion"], "policy/v1")
        budget = one(render(["--kube-version", "1.20.2"]), "PodDisruptionBudget")
        self.assertEqual(budget["apiVersion"], "policy/v1beta1")
        self.assertEqual(budget["spec"]["minAvailable"], 1)
        self.assertEqual(budget["spec"]["selector"]["matchLabels"],
                         deployment(render())["spec"]["selector"]["matchLabels"])

    # --- Images --------------------------------------------------------------------------------

    def test_images_must_be_named(self):
        # Nothing publishes the images: without a registry the chart says what to set (helm
        # install renders the same way; tests/e2e/readme_e2e_test.py sees it refused there).
        result = run_helm(["template", RELEASE, CHART], check=False)
        self.assertNotEqual(result.returncode, 0, result.stdout[:300])
        self.assertIn("image.registry is not set", result.stderr)
        self.assertIn("--set image.registry=", result.stderr)
        # The registry names both images; a repository of its own wins.
        docs = render()
        self.assertEqual(operator_container(docs)["image"], f"{REGISTRY}/operator:0.1.0")
        self.assertEqual(injection_config(docs)["image"], f"{REGISTRY}/sidecar:0.1.0")
        docs = render(["--set", "image.registry=", "--set", "image.repository=a.example/op",
                       "--set", "sidecar.image.repository=b.example/sc",
                       "--set", "image.tag=1.2.3"])
        self.assertEqual(operator_container(docs)["image"], "a.example/op:1.2.3")
        self.assertEqual(injection_config(docs)["image"], "b.example/sc:0.1.0")
        # One of the two set is not enough.
        result = run_helm(["template", RELEASE, CHART, "--set", "image.repository=a.example/op"],
                          check=False)
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("image.registry is not set", result.stderr)
        # The node tests' values name the images scripts/build-images makes.
        docs = [doc for doc in yaml.safe_load_all(run_helm(
            ["template", RELEASE, CHART, "-f",
             os.path.join(SOURCE_DIR, "tests", "e2e", "local-node-values.yaml")]).stdout) if doc]
        self.assertEqual(operator_container(docs)["image"], "localhost/clusterprof/operator:0.1.0")
        self.assertEqual(injection_config(docs)["image"], "localhost/clusterprof/sidecar:0.1.0")

    def test_sidecar_image_pull_secrets(self):
        # Rendered only when set, as the list of names the webhook adds to injected pods.
        self.assertNotIn("image_pull_secrets", injection_config(render()))
        config = injection_config(render(["--set", "sidecar.imagePullSecrets={regcred,mirror}"]))
        self.assertEqual(config["image_pull_secrets"], ["regcred", "mirror"])
        result = run_helm(["template", RELEASE, CHART] + BASE +
                          ["--set", "sidecar.imagePullSecrets[0].name=regcred"], check=False)
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("imagePullSecrets", result.stderr)

    # --- Users' roles --------------------------------------------------------------------------

    def test_user_roles_aggregate_into_edit_admin_and_view(self):
        docs = render()
        edit = one(docs, "ClusterRole", f"{RELEASE}-edit")
        view = one(docs, "ClusterRole", f"{RELEASE}-view")
        labels = lambda role: {k: v for k, v in role["metadata"]["labels"].items()
                               if k.startswith("rbac.authorization.k8s.io/")}
        self.assertEqual(labels(edit), {"rbac.authorization.k8s.io/aggregate-to-edit": "true",
                                        "rbac.authorization.k8s.io/aggregate-to-admin": "true"})
        self.assertEqual(labels(view), {"rbac.authorization.k8s.io/aggregate-to-view": "true"})
        kinds = {"profilejobs", "profileschedules", "profiletriggers"}
        table = lambda role: {(g, r): set(rule["verbs"]) for rule in role["rules"]
                              for g in rule["apiGroups"] for r in rule["resources"]}
        expected_edit = {("clusterprof.io", k): {"get", "list", "watch", "create", "update",
                                                 "patch", "delete", "deletecollection"}
                         for k in kinds}
        expected_edit.update({("clusterprof.io", k + "/status"): {"get", "list", "watch"}
                              for k in kinds})
        self.assertEqual(table(edit), expected_edit)
        expected_view = {("clusterprof.io", k): {"get", "list", "watch"}
                         for k in kinds | {k + "/status" for k in kinds}}
        self.assertEqual(table(view), expected_view)
        # Every kind of the CRDs is in them: a new CRD without a line here fails.
        crd_kinds = {c["spec"]["names"]["plural"] for c in
                     of_kind(render(include_crds=True), "CustomResourceDefinition")}
        self.assertEqual({r for (_, r) in table(edit) if "/" not in r}, crd_kinds)
        # Off: no user roles, the operator's untouched.
        docs = render(["--set", "rbac.aggregateToDefaultRoles=false"])
        self.assertEqual([r["metadata"]["name"] for r in of_kind(docs, "ClusterRole")],
                         [f"{RELEASE}-operator"])

    # --- Pod Security --------------------------------------------------------------------------

    def test_helm_test_pulls_and_runs_the_sidecar_image(self):
        # `helm test`: the sidecar image, as injection names it, with the operator's pull secrets.
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import pod_security
        docs = render(["--set", "preset=gpu", "--set", "imagePullSecrets[0].name=registry",
                       "--set", "sidecar.image.tag=9.9.9"])
        pod = one(docs, "Pod")
        self.assertEqual(pod["metadata"]["annotations"]["helm.sh/hook"], "test")
        self.assertIn("hook-succeeded", pod["metadata"]["annotations"]["helm.sh/hook-delete-policy"])
        spec = pod["spec"]
        self.assertEqual(spec["restartPolicy"], "Never")
        self.assertEqual(spec["imagePullSecrets"], [{"name": "registry"}])
        [container] = spec["containers"]
        self.assertEqual(container["image"], injection_config(docs)["image"])
        self.assertTrue(container["image"].endswith("/sidecar:9.9.9"), container["image"])
        self.assertEqual(container["imagePullPolicy"], injection_config(docs)["image_pull_policy"])
        self.assertEqual(container["args"], ["--version"])
        # It schedules where the operator may (the preset's tolerations) and is restricted too.
        self.assertEqual(spec["tolerations"], deployment(docs)["spec"]["template"]["spec"]
                         ["tolerations"])
        self.assertEqual(pod_security.check(spec, pod["metadata"].get("annotations")), [])

    def test_operator_pod_meets_the_restricted_pod_security_standard(self):
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import pod_security
        variants = dict(VARIANTS)
        variants["preset-gpu-watch-namespace"] = ["--set", "preset=gpu",
                                                  "--set", "operator.watchNamespace=training"]
        for name, extra in variants.items():
            with self.subTest(variant=name):
                template = deployment(render(extra))["spec"]["template"]
                self.assertEqual(pod_security.check(
                    template["spec"], template["metadata"].get("annotations")), [])
        # The checker is not a rubber stamp: each rule it applies can fail.
        pod = deployment(render())["spec"]["template"]["spec"]
        broken = yaml.safe_load(yaml.safe_dump(pod))
        container = broken["containers"][0]
        container["securityContext"].pop("allowPrivilegeEscalation")
        container["securityContext"]["capabilities"] = {"add": ["SYS_ADMIN"]}
        container["securityContext"].pop("seccompProfile")
        broken["securityContext"].pop("seccompProfile")
        broken["volumes"].append({"name": "host", "hostPath": {"path": "/"}})
        broken["hostNetwork"] = True
        controls = {v.split(":")[0] for v in pod_security.check(broken)}
        self.assertEqual(controls, {"Privilege Escalation", "Capabilities", "Seccomp",
                                    "HostPath Volumes", "Host Namespaces", "Volume Types"})
        self.assertEqual({v.split(":")[0] for v in pod_security.check(broken, level="baseline")},
                         {"Capabilities", "HostPath Volumes", "Host Namespaces"})

    # --- Schema --------------------------------------------------------------------------------

    def test_schema_refuses_bad_values(self):
        cases = [
            (["--set", "replicas=-1"], "replicas"),
            (["--set", "preset=foo"], "preset"),
            (["--set", "bogus=1"], "bogus"),
            (["--set", "sidecar.bogus=1"], "bogus"),
            (["--set", "sidecar.port=0"], "sidecar.port"),
            (["--set", "sidecar.image.pullPolicy=Sometimes"], "pullPolicy"),
            (["--set", "image.pullPolicy=Sometimes"], "pullPolicy"),
            (["--set", "webhook.failurePolicy=Maybe"], "failurePolicy"),
            (["--set", "webhook.timeoutSeconds=60"], "timeoutSeconds"),
            (["--set", "operator.logLevel=loud"], "logLevel"),
            (["--set", "sidecar.allowedLogdirs={s3://bucket}"], "allowedLogdirs"),
            (["--set", "auth.namespaces={Not_A_Namespace}"], "auth.namespaces"),
            (["--set-string", "replicas=two"], "replicas"),
            (["--set", "grafana.dashboard.bogus=1"], "bogus"),
            (["--set", "grafana.dashboard.enabled=yes"], "enabled"),
            (["--set", "grafana.dashboard.label=not a label"], "grafana.dashboard.label"),
            (["--set", "grafana.dashboard.namespace=Not_A_Namespace"], "grafana.dashboard.namespace"),
            (["--set", "podMonitor.namespaces={Not_A_Namespace}"], "podMonitor.namespaces"),
            (["--set", "podMonitor.bogus=1"], "bogus"),
            (["--set", "sidecar.tls.bogus=1"], "bogus"),
            (["--set", "sidecar.tls.enabled=yes"], "enabled"),
            (["--set", "sidecar.tls.validityDays=0"], "sidecar.tls.validityDays"),
            (["--set", "sidecar.tls.caValidityDays=0"], "sidecar.tls.caValidityDays"),
            (["--set", "sidecar.tls.serverName=Not_A_Name"], "sidecar.tls.serverName"),
            (["--set", "sidecar.tls.secretName="], "sidecar.tls.secretName"),
            (["--set", "sidecar.tls.existingSecret=Not_A_Name"], "sidecar.tls.existingSecret"),
            (["--set", "auth.tokenGraceSeconds=-1"], "auth.tokenGraceSeconds"),
            (["--set", "auth.tokenGraceSeconds=86401"], "auth.tokenGraceSeconds"),
            (["--set", "auth.token=short"], "auth.token"),
            (["--set", "auth.token=has spaces in the token value"], "auth.token"),
        ]
        for extra, key in cases:
            with self.subTest(values=extra):
                result = run_helm(["template", RELEASE, CHART] + extra, check=False)
                self.assertNotEqual(result.returncode, 0, result.stdout[:200])
                self.assertIn("values don't meet the specifications of the schema",
                              result.stderr)
                self.assertIn(key, result.stderr)


def main():
    global HELM
    HELM = find_helm()
    if not HELM:
        print("SKIPPED: helm is not installed; scripts/install-helm installs it (or set "
              "CLUSTERPROF_HELM)", flush=True)
        return SKIP_CODE
    version = subprocess.run([HELM, "version", "--short"], capture_output=True, text=True)
    print(f"helm: {HELM} ({version.stdout.strip()})", flush=True)
    program = unittest.main(exit=False, verbosity=2)
    return 0 if program.result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
