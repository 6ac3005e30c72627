{{/* The chart name, overridable. */}}
{{- define "keyorder-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The full name of the release's objects, truncated to 63 characters (the DNS label limit).
If the release name already contains the chart name, it is used as is.
*/}}
{{- define "keyorder-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* name-version, for the helm.sh/chart label. */}}
{{- define "keyorder-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object of the release (commonLabels last: they may not replace the chart's own). */}}
{{- define "keyorder-operator.labels" -}}
helm.sh/chart: {{ include "keyorder-operator.chart" . }}
{{ include "keyorder-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: keyorder
app.kubernetes.io/component: operator
{{- range $key, $value := .Values.commonLabels }}
{{- if hasPrefix "app.kubernetes.io/" $key }}
{{- fail (printf "commonLabels: %s is set by the chart; choose another label" $key) }}
{{- end }}
{{ $key }}: {{ $value | quote }}
{{- end }}
{{- end }}

{{/* Labels that select the operator's pods (never change them: Deployment selectors are immutable). */}}
{{- define "keyorder-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "keyorder-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The operator's ServiceAccount name. */}}
{{- define "keyorder-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "keyorder-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The image reference: repository@digest, else repository:tag (tag defaults to appVersion). */}}
{{- define "keyorder-operator.image" -}}
{{- if eq .Values.image.tag "latest" }}
{{- fail "image.tag: 'latest' is refused; pin a version (or set image.digest)" }}
{{- end }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* True (non-empty) when the operator watches the whole cluster. */}}
{{- define "keyorder-operator.clusterwide" -}}
{{- if not .Values.operator.watchNamespaces }}true{{ end }}
{{- end }}

{{/*
RBAC rules for the resources in each watched namespace: the OrderedConsumers (for kopf) and what
the operator creates for them. Used by the ClusterRole (whole cluster) or a Role per namespace.
tests/packaging/test_rbac.py checks them against keyorder_operator.rbac (the operator's calls
and kopf's needs): every call allowed, nothing more.
*/}}
{{- define "keyorder-operator.namespacedRules" -}}
# kopf watches the OrderedConsumers and patches their finalizers and progress annotations.
- apiGroups: ["keyorder.dev"]
  resources: ["orderedconsumers"]
  verbs: ["list", "watch", "patch"]
# The owned objects' ownerReferences set blockOwnerDeletion: clusters enforcing
# OwnerReferencesPermissionEnforcement (e.g. OpenShift) require update on the owner's finalizers.
- apiGroups: ["keyorder.dev"]
  resources: ["orderedconsumers/finalizers"]
  verbs: ["update"]
# kopf writes status (conditions, lag, the last decision) through the status subresource.
- apiGroups: ["keyorder.dev"]
  resources: ["orderedconsumers/status"]
  verbs: ["patch"]
# Events explaining each decision: Scaled, InvalidSpec, LagUnknown.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
# The consumers' Deployment: server-side applied (patch; an apply that creates it is authorised as
# create too), its replicas set by the autoscaler (patch); watched (list, watch: only the
# operator's, by label) into the cache each poll reads, and read (get) when the cache does not have it.
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "patch", "create", "list", "watch"]
# The consumers' headless metrics Service and their ServiceAccount (which gets no Role and no
# token): server-side applied (patch, and create for the apply that creates them), and watched
# like the Deployment to see whether anyone changed or deleted them since.
- apiGroups: [""]
  resources: ["services", "serviceaccounts"]
  verbs: ["get", "patch", "create", "list", "watch"]
# A PodDisruptionBudget per consumer group (at most one pod down by voluntary disruption):
# server-side applied, and watched like the others.
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "patch", "create", "list", "watch"]
# The consumer pods' NetworkPolicy (networkPolicy.consumerPods): server-side applied and watched like the
# others; delete when that switch is turned off, so no policy of a past setting stays behind.
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "patch", "create", "list", "watch", "delete"]
# Secrets: create each group's admin-token Secret once, then read it (to push worker counts) and
# the Kafka client-properties Secret a resource names (to read its lag). No list, no watch.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "create"]
# Pods: the consumer pods are watched (by label) to push the decided worker count to the ready
# ones; list also waits until none is left before a catch-up Job starts.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch"]
# HorizontalPodAutoscalers: listed when the consumers' replicas changed behind the operator's back,
# to name another autoscaler (an HPA, or KEDA's) that scales the same Deployment and stop fighting it.
- apiGroups: ["autoscaling"]
  resources: ["horizontalpodautoscalers"]
  verbs: ["list"]
# The Spark catch-up Job: created once per backlog, read for its outcome (finished Jobs expire
# through ttlSecondsAfterFinished, so no delete).
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "create"]
{{- if and .Values.peering.enabled .Values.operator.watchNamespaces }}
# kopf peering in this namespace: replicas record their liveness; only one handles resources
# (list, watch, patch); the operator checks the object exists at start-up and on health probes (get).
- apiGroups: ["kopf.dev"]
  resources: ["kopfpeerings"]
  verbs: ["get", "list", "watch", "patch"]
{{- end }}
{{- end }}
