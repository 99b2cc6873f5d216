{{/* Chart name, overridable. */}}
{{- define "baton.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Release-scoped name of the operator's objects. */}}
{{- define "baton.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "baton.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "baton.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "baton.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "baton.selectorLabels" -}}
app.kubernetes.io/name: {{ include "baton.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "baton.labels" -}}
helm.sh/chart: {{ include "baton.chart" . }}
{{ include "baton.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: baton
{{- end -}}

{{- define "baton.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "baton.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "baton.operatorImage" -}}
{{- printf "%s:%s" .Values.operator.image.repository (default .Chart.AppVersion .Values.operator.image.tag) -}}
{{- end -}}

{{/* The restricted Pod Security Standard, for every container the chart runs. */}}
{{- define "baton.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "baton.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* RBAC rules for what the operator does inside the namespaces it serves. */}}
{{- define "baton.namespacedRules" -}}
- apiGroups: ["serving.baton.dev"]
  resources: ["batondeployments"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["serving.baton.dev"]
  resources: ["workerpools"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["serving.baton.dev"]
  resources: ["batondeployments/status", "workerpools/status"]
  verbs: ["get", "patch"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["services", "serviceaccounts"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# Each router gets a ServiceAccount and Role to watch its workers' EndpointSlices; Kubernetes lets the operator
# grant only what it holds itself, hence the read access to endpointslices.
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["discovery.k8s.io"]
  resources: ["endpointslices"]
  verbs: ["get", "list", "watch"]
- apiGroups: [""]
  # Pods are only labelled with a deletion cost before a drain; the operator never creates or deletes them.
  resources: ["pods"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["", "events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- if .Values.rbac.serviceMonitors }}
- apiGroups: ["monitoring.coreos.com"]
  resources: ["servicemonitors"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
{{- end }}
{{- if .Values.rbac.leaderWorkerSets }}
# A pool whose tensorParallelSize exceeds gpusPerNode runs as a LeaderWorkerSet (the LWS controller's API).
- apiGroups: ["leaderworkerset.x-k8s.io"]
  resources: ["leaderworkersets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
{{- end }}
{{- end }}

{{/*
The labels a Baton pod's metrics get from its pod labels: the dashboards and the autoscaler select
by pool, role and deployment.
*/}}
{{- define "baton.podMonitorLabels" -}}
- sourceLabels: [__meta_kubernetes_pod_label_serving_baton_dev_pool]
  targetLabel: pool
- sourceLabels: [__meta_kubernetes_pod_label_serving_baton_dev_role]
  targetLabel: role
- sourceLabels: [__meta_kubernetes_pod_label_serving_baton_dev_deployment]
  targetLabel: deployment
{{- end }}
