// A pod as a training job's controller makes it on a GPU node pool, with the status a kubelet
// writes: the shape the informer benchmarks cache by the thousand. About 6 KiB of JSON with its
// managedFields, 4 KiB without.
#ifndef CLUSTERPROF_BENCH_REALISTIC_POD_H_
#define CLUSTERPROF_BENCH_REALISTIC_POD_H_

#include <string>

#include "common/base/strings.h"

namespace clusterprof::bench {

// `"status":{...}` as a kubelet reports a running, ready pod. Its pod IP is a loopback address
// (127.64.x.y where a cluster would have 10.64.x.y), at which nothing listens: an
// operator watching these pods connects to their sidecars ahead of captures, and a benchmark's
// connections stay on this machine.
inline std::string RealisticPodStatusJson(int index) {
  return StrCat(
      R"("status":{"phase":"Running","hostIP":"10.128.0.)", index % 250, R"(","podIP":"127.64.)",
      index / 250 % 250, ".", index % 250, R"(","podIPs":[{"ip":"127.64.)", index / 250 % 250, ".",
      index % 250, R"("}],"startTime":"2026-11-22T06:00:05Z","qosClass":"Burstable",)",
      R"("conditions":[{"type":"Initialized","status":"True","lastProbeTime":null,"lastTransitionTime":"2026-11-22T06:00:05Z"},)",
      R"({"type":"Ready","status":"True","lastProbeTime":null,"lastTransitionTime":"2026-11-22T06:01:10Z"},)",
      R"({"type":"ContainersReady","status":"True","lastProbeTime":null,"lastTransitionTime":"2026-11-22T06:01:10Z"},)",
      R"({"type":"PodScheduled","status":"True","lastProbeTime":null,"lastTransitionTime":"2026-11-22T06:00:00Z"}],)",
      R"("containerStatuses":[{"name":"trainer","state":{"running":{"startedAt":"2026-11-22T06:01:09Z"}},)",
      R"("lastState":{},"ready":true,"restartCount":0,"image":"us-docker.pkg.dev/example/llama/trainer:2026.11.1",)",
      R"("imageID":"us-docker.pkg.dev/example/llama/trainer@sha256:4f9c1d2e3b4a59687766554433221100ffeeddccbbaa99887766554433221100",)",
      R"("containerID":"containerd://9b8a7c6d5e4f30211203)", 100000 + index,
      R"(","started":true},{"name":"clusterprof-sidecar","state":{"running":{"startedAt":"2026-11-22T06:00:07Z"}},)",
      R"("lastState":{},"ready":true,"restartCount":0,"image":"clusterprof/sidecar:0.1.0",)",
      R"("imageID":"clusterprof/sidecar@sha256:00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff",)",
      R"("containerID":"containerd://1a2b3c4d5e6f70819203)", 100000 + index,
      R"(","started":true}]})");
}

// The pod's spec and metadata (what a create sends), numbered `index`.
inline std::string RealisticPodJson(const std::string& ns, int index, bool with_status = false,
                                    bool with_managed_fields = false) {
  const std::string name = StrCat("llama-trainer-worker-", index);
  std::string pod = StrCat(R"({"apiVersion":"v1","kind":"Pod","metadata":{"name":")", name,
                           R"(","namespace":")", ns, R"(",)");
  if (with_status) {
    StrAppend(&pod, R"("uid":"6f1c2a9e-3b4d-4c5e-8f70-)", 100000000000 + index,
              R"(","resourceVersion":")", 1000 + index,
              R"(","creationTimestamp":"2026-11-22T06:00:00Z",)");
  }
  StrAppend(
      &pod, R"("labels":{"app":"llama-trainer","jobset.sigs.k8s.io/jobset-name":"llama-7b",)",
      R"("jobset.sigs.k8s.io/replicatedjob-name":"worker","batch.kubernetes.io/job-completion-index":")",
      index % 64, R"(","clusterprof.io/inject":"true"},)",
      R"("annotations":{"clusterprof.io/port":"8466",)",
      R"("kubectl.kubernetes.io/default-container":"trainer",)",
      R"("cluster-autoscaler.kubernetes.io/safe-to-evict":"false"},)",
      R"("ownerReferences":[{"apiVersion":"batch/v1","kind":"Job","name":"llama-7b-worker-0",)",
      R"("uid":"0d7d3b8e-6a55-4c1a-9c1e-5b0c2f7a9d11","controller":true,"blockOwnerDeletion":true}])");
  if (with_managed_fields) {
    StrAppend(
        &pod, R"(,"managedFields":[{"manager":"job-controller","operation":"Update",)",
        R"("apiVersion":"v1","time":"2026-11-22T06:00:00Z","fieldsType":"FieldsV1",)",
        R"("fieldsV1":{"f:metadata":{"f:labels":{".":{},"f:app":{},"f:batch.kubernetes.io/job-completion-index":{}},)",
        R"("f:ownerReferences":{".":{},"k:{\"uid\":\"0d7d3b8e\"}":{}}},"f:spec":{"f:containers":{"k:{\"name\":\"trainer\"}":)",
        R"({".":{},"f:args":{},"f:command":{},"f:env":{".":{},"k:{\"name\":\"JAX_COORDINATOR\"}":{".":{},"f:name":{},"f:value":{}}},)",
        R"("f:image":{},"f:imagePullPolicy":{},"f:name":{},"f:ports":{},"f:resources":{},"f:volumeMounts":{}}},)",
        R"("f:nodeSelector":{},"f:restartPolicy":{},"f:tolerations":{},"f:volumes":{}}}},)",
        R"({"manager":"kubelet","operation":"Update","apiVersion":"v1","time":"2026-11-22T06:01:00Z",)",
        R"("fieldsType":"FieldsV1","subresource":"status","fieldsV1":{"f:status":{"f:conditions":{},)",
        R"("f:containerStatuses":{},"f:hostIP":{},"f:phase":{},"f:podIP":{},"f:podIPs":{},"f:startTime":{}}}}])");
  }
  StrAppend(
      &pod, R"(},"spec":{"restartPolicy":"Never","serviceAccountName":"llama-trainer",)",
      R"("nodeName":"gke-llama-h100-pool-7f3a-)", index / 8, R"(",)",
      R"("nodeSelector":{"cloud.google.com/gke-accelerator":"nvidia-h100-80gb","cloud.google.com/gke-nodepool":"h100-pool"},)",
      R"("tolerations":[{"key":"nvidia.com/gpu","operator":"Exists","effect":"NoSchedule"},)",
      R"({"key":"node.kubernetes.io/not-ready","operator":"Exists","effect":"NoExecute","tolerationSeconds":300}],)",
      R"("containers":[{"name":"trainer","image":"us-docker.pkg.dev/example/llama/trainer:2026.11.1",)",
      R"("command":["python3","-m","llama.train"],"args":["--config=/etc/llama/7b.yaml","--steps=100000"],)",
      R"("env":[{"name":"JAX_COORDINATOR","value":"llama-7b-worker-0-0.llama-7b:1234"},)",
      R"({"name":"JAX_PROCESS_ID","value":")", index,
      R"("},{"name":"CLUSTERPROF_DIR","value":"/var/run/clusterprof"},)",
      R"({"name":"NCCL_DEBUG","value":"WARN"},{"name":"XLA_FLAGS","value":"--xla_gpu_enable_latency_hiding_scheduler=true"}],)",
      R"("ports":[{"name":"coordinator","containerPort":1234,"protocol":"TCP"}],)",
      R"("resources":{"limits":{"nvidia.com/gpu":"8","memory":"1000Gi"},"requests":{"cpu":"200","memory":"1000Gi","nvidia.com/gpu":"8"}},)",
      R"("volumeMounts":[{"name":"config","mountPath":"/etc/llama"},{"name":"dshm","mountPath":"/dev/shm"},)",
      R"({"name":"clusterprof","mountPath":"/var/run/clusterprof"},)",
      R"({"name":"kube-api-access","readOnly":true,"mountPath":"/var/run/secrets/kubernetes.io/serviceaccount"}]},)",
      R"({"name":"clusterprof-sidecar","image":"clusterprof/sidecar:0.1.0","ports":[{"name":"profiler","containerPort":8466,"protocol":"TCP"}],)",
      R"("resources":{"requests":{"cpu":"100m","memory":"64Mi"}},"volumeMounts":[{"name":"clusterprof","mountPath":"/var/run/clusterprof"}]}],)",
      R"("volumes":[{"name":"config","configMap":{"name":"llama-7b-config"}},{"name":"dshm","emptyDir":{"medium":"Memory"}},)",
      R"({"name":"clusterprof","emptyDir":{"medium":"Memory","sizeLimit":"256Mi"}},)",
      R"({"name":"kube-api-access","projected":{"defaultMode":420,"sources":[{"serviceAccountToken":{"expirationSeconds":3607,"path":"token"}},)",
      R"({"configMap":{"name":"kube-root-ca.crt","items":[{"key":"ca.crt","path":"ca.crt"}]}},)",
      R"({"downwardAPI":{"items":[{"path":"namespace","fieldRef":{"apiVersion":"v1","fieldPath":"metadata.namespace"}}]}}]}}]})");
  if (with_status) StrAppend(&pod, ",", RealisticPodStatusJson(index));
  pod += "}";
  return pod;
}

}  // namespace clusterprof::bench

#endif  // CLUSTERPROF_BENCH_REALISTIC_POD_H_
