{{/*
Names. Every generated name is cut to 63 characters and loses a trailing
"-", so it stays a valid DNS label (RFC 1123) whatever the release is called.
Suffixed names cut the base first so the suffix always survives.
*/}}

{{- define "pagedinfer.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "pagedinfer.fullname" -}}
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

{{/* "<fullname>-<suffix>", the base cut so that the whole fits 63 characters. */}}
{{- define "pagedinfer.suffixed" -}}
{{- $root := index . 0 -}}
{{- $suffix := index . 1 -}}
{{- $base := include "pagedinfer.fullname" $root | trunc (int (sub 62 (len $suffix))) | trimSuffix "-" -}}
{{- printf "%s-%s" $base $suffix -}}
{{- end -}}

{{- define "pagedinfer.operator.fullname" -}}
{{- include "pagedinfer.suffixed" (list . "operator") -}}
{{- end -}}

{{- define "pagedinfer.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels on every object of the release. */}}
{{- define "pagedinfer.labels" -}}
helm.sh/chart: {{ include "pagedinfer.chart" . }}
app.kubernetes.io/name: {{ include "pagedinfer.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: pagedinfer
{{- end -}}

{{/* The operator pods' selector: stable across upgrades, never the version. */}}
{{- define "pagedinfer.operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "pagedinfer.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "pagedinfer.operator.labels" -}}
{{ include "pagedinfer.labels" . }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "pagedinfer.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "pagedinfer.operator.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* "repository@digest" when a digest is given, else "repository:tag". */}}
{{- define "pagedinfer.image" -}}
{{- $image := index . 0 -}}
{{- $appVersion := index . 1 -}}
{{- if $image.digest -}}
{{- printf "%s@%s" $image.repository $image.digest -}}
{{- else -}}
{{- printf "%s:%s" $image.repository (default $appVersion $image.tag) -}}
{{- end -}}
{{- end -}}

{{/* kopf peering is on exactly when more than one operator pod runs. */}}
{{- define "pagedinfer.peering.enabled" -}}
{{- if gt (int .Values.operator.replicas) 1 -}}true{{- end -}}
{{- end -}}

{{/* The peering object's name (one per release). */}}
{{- define "pagedinfer.peering.name" -}}
{{- include "pagedinfer.fullname" . -}}
{{- end -}}

{{/* KopfPeering (namespaced operator) or ClusterKopfPeering (cluster-wide). */}}
{{- define "pagedinfer.peering.kind" -}}
{{- if eq .Values.rbac.scope "cluster" -}}ClusterKopfPeering{{- else -}}KopfPeering{{- end -}}
{{- end -}}

{{/* True when any prometheus-operator object (monitoring.coreos.com/v1) is asked for. */}}
{{- define "pagedinfer.monitoring.enabled" -}}
{{- $m := .Values.monitoring -}}
{{- if or $m.engine.podMonitor.enabled $m.router.podMonitor.enabled $m.operator.serviceMonitor.enabled $m.prometheusRule.enabled -}}true{{- end -}}
{{- end -}}

{{/*
Engine pods as the operator labels them (operator/ builds them; keep in step
with its builders, tests/chart checks the pair).
*/}}
{{- define "pagedinfer.engine.selectorLabels" -}}
app.kubernetes.io/name: pagedinfer-engine
{{- end -}}

{{/* Router pods as the operator labels them (operator/routing/builders.py; tests/chart checks the pair). */}}
{{- define "pagedinfer.router.selectorLabels" -}}
app.kubernetes.io/name: pagedinfer-router
{{- end -}}

{{/* The engine container's named port serving the API and /metrics. */}}
{{- define "pagedinfer.engine.metricsPortName" -}}
http
{{- end -}}

{{/* The operator's reconcile-error counter (operator/metrics.py). */}}
{{- define "pagedinfer.operator.reconcileErrorsMetric" -}}
pagedinfer_operator_reconcile_errors_total
{{- end -}}
