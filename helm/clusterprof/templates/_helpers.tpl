{{/* Names. */}}
{{- define "clusterprof.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "clusterprof.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* "<fullname>-<suffix>", within 63 characters. */}}
{{- define "clusterprof.component" -}}
{{- printf "%s-%s" (include "clusterprof.fullname" .root | trunc (int (sub 62 (len .suffix))) | trimSuffix "-") .suffix -}}
{{- end -}}

{{- define "clusterprof.operatorName" -}}
{{- include "clusterprof.component" (dict "root" . "suffix" "operator") -}}
{{- end -}}

{{- define "clusterprof.webhookServiceName" -}}
{{- include "clusterprof.component" (dict "root" . "suffix" "webhook") -}}
{{- end -}}

{{- define "clusterprof.webhookSecretName" -}}
{{- include "clusterprof.component" (dict "root" . "suffix" "webhook-tls") -}}
{{- end -}}

{{- define "clusterprof.injectionConfigName" -}}
{{- include "clusterprof.component" (dict "root" . "suffix" "injection") -}}
{{- end -}}

{{- define "clusterprof.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "clusterprof.operatorName" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The Secret with the sidecar token ("" with auth off). */}}
{{- define "clusterprof.tokenSecretName" -}}
{{- if .Values.auth.enabled -}}
{{- default .Values.auth.secretName .Values.auth.existingSecret -}}
{{- end -}}
{{- end -}}

{{/* The sidecars' TLS Secret ("" with sidecar.tls off): mounted by the webhook into each sidecar,
and its ca.crt by the operator, from the release namespace. */}}
{{- define "clusterprof.sidecarTlsSecretName" -}}
{{- if .Values.sidecar.tls.enabled -}}
{{- default .Values.sidecar.tls.secretName .Values.sidecar.tls.existingSecret -}}
{{- end -}}
{{- end -}}

{{/* The CA that signs the sidecars' certificate: its key lives only in this Secret of the release
namespace. */}}
{{- define "clusterprof.sidecarCaSecretName" -}}
{{- include "clusterprof.component" (dict "root" . "suffix" "sidecar-ca") -}}
{{- end -}}

{{/* Labels. */}}
{{- define "clusterprof.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "clusterprof.labels" -}}
helm.sh/chart: {{ include "clusterprof.chart" . }}
{{ include "clusterprof.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: clusterprof
{{- end -}}

{{- define "clusterprof.selectorLabels" -}}
app.kubernetes.io/name: {{ include "clusterprof.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The operator pods' labels: what the Services, the PDB and the NetworkPolicy select. */}}
{{- define "clusterprof.operatorSelectorLabels" -}}
{{ include "clusterprof.selectorLabels" . }}
app.kubernetes.io/component: operator
{{- end -}}

{{/* The preset's values (presets/<preset>.yaml) as YAML. */}}
{{- define "clusterprof.presetValues" -}}
{{- $file := printf "presets/%s.yaml" (.Values.preset | default "none") -}}
{{- $content := .Files.Get $file -}}
{{- if not $content -}}
{{- fail (printf "preset %q: the chart has no %s (presets are none, gpu and tpu)" .Values.preset $file) -}}
{{- end -}}
{{- $content -}}
{{- end -}}

{{/*
The values that presets fill in, as YAML: the user's where set (hasKey, so "" and [] count as
set), else the preset's.
*/}}
{{- define "clusterprof.effective" -}}
{{- $preset := include "clusterprof.presetValues" . | fromYaml -}}
{{- $sidecar := .Values.sidecar -}}
{{- $out := dict -}}
{{- range $key := list "gpuLibrary" "frameworkProfiler" "resources" -}}
{{- if hasKey $sidecar $key -}}
{{- $_ := set $out $key (index $sidecar $key) -}}
{{- else -}}
{{- $_ := set $out $key (index $preset.sidecar $key) -}}
{{- end -}}
{{- end -}}
{{- if hasKey .Values "tolerations" -}}
{{- $_ := set $out "tolerations" .Values.tolerations -}}
{{- else -}}
{{- $_ := set $out "tolerations" $preset.tolerations -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}

{{/*
An image reference: (dict "root" $ "image" <image values> "name" "operator"|"sidecar"). The
repository is the image's own, else image.registry/<name>; neither set fails the render with
what to set.
*/}}
{{- define "clusterprof.image" -}}
{{- $repository := .image.repository -}}
{{- if not $repository -}}
{{- $registry := .root.Values.image.registry | default "" | trimSuffix "/" -}}
{{- if not $registry -}}
{{- fail `image.registry is not set: nothing publishes the clusterprof images, so the chart needs the registry you pushed them to (README.md, "On Kubernetes"): --set image.registry=REGION-docker.pkg.dev/PROJECT/REPOSITORY (the chart then uses REGISTRY/operator and REGISTRY/sidecar), or set image.repository and sidecar.image.repository` -}}
{{- end -}}
{{- $repository = printf "%s/%s" $registry .name -}}
{{- end -}}
{{- printf "%s:%s" $repository (default .root.Chart.AppVersion .image.tag) -}}
{{- end -}}

{{/* The injection config the operator reads (--injection-config); keys as in docs/webhook.md. */}}
{{- define "clusterprof.injectionConfig" -}}
{{- $effective := include "clusterprof.effective" . | fromYaml -}}
{{- $sidecar := .Values.sidecar -}}
image: {{ include "clusterprof.image" (dict "image" $sidecar.image "root" . "name" "sidecar") | quote }}
image_pull_policy: {{ $sidecar.image.pullPolicy }}
{{- with $sidecar.imagePullSecrets }}
image_pull_secrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
native_sidecar: {{ $sidecar.nativeSidecar }}
port: {{ $sidecar.port }}
http_port: {{ $sidecar.httpPort }}
resources:
  {{- toYaml ($effective.resources | default dict) | nindent 2 }}
token_secret: {{ include "clusterprof.tokenSecretName" . | quote }}
token_grace_seconds: {{ .Values.auth.tokenGraceSeconds | int }}
{{- with include "clusterprof.sidecarTlsSecretName" . }}
tls_secret: {{ . | quote }}
{{- end }}
allowed_logdirs:
  {{- toYaml ($sidecar.allowedLogdirs | default list) | nindent 2 }}
framework_profiler: {{ $effective.frameworkProfiler | default "" | quote }}
gpu_library: {{ $effective.gpuLibrary | default "" | quote }}
recorder_level: {{ $sidecar.recorder.level }}
recorder_window_ms: {{ $sidecar.recorder.windowMs | int64 }}
recorder_max_bytes: {{ $sidecar.recorder.maxBytes | int64 }}
start_realtime: {{ $sidecar.startRealtime | default false }}
{{- $extraArgs := $sidecar.extraArgs | default list }}
{{- if and .Values.auth.enabled .Values.auth.allowPortForward }}
{{- $extraArgs = append $extraArgs "--allow-loopback-without-token" }}
{{- end }}
extra_args:
  {{- toYaml $extraArgs | nindent 2 }}
env:
  {{- toYaml ($sidecar.extraEnv | default dict) | nindent 2 }}
{{- end -}}

{{/* Restricted pod security, for every pod the chart runs. */}}
{{- define "clusterprof.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "clusterprof.containerSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
privileged: false
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}
