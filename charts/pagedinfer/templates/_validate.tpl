{{/*
Combinations of values that cannot work stop the install here, each with a
message naming the value to change. Included once, by the operator workload.
*/}}
{{- define "pagedinfer.validate" -}}
{{- if not (has .Values.rbac.scope (list "cluster" "namespace")) -}}
{{- fail (printf "rbac.scope must be \"cluster\" or \"namespace\", got %q" (toString .Values.rbac.scope)) -}}
{{- end -}}
{{- if and (not .Values.serviceAccount.create) (not .Values.serviceAccount.name) -}}
{{- fail "serviceAccount.name is required when serviceAccount.create is false: name the ServiceAccount the operator should run as" -}}
{{- end -}}
{{- if lt (int .Values.operator.replicas) 1 -}}
{{- fail (printf "operator.replicas must be at least 1, got %v" .Values.operator.replicas) -}}
{{- end -}}
{{- if eq (int .Values.operator.healthPort) (int .Values.operator.metricsPort) -}}
{{- fail (printf "operator.healthPort and operator.metricsPort must differ (both are %v)" .Values.operator.healthPort) -}}
{{- end -}}
{{- range .Values.operator.extraArgs -}}
{{- $flag := regexReplaceAll "=.*$" (toString .) "" -}}
{{- if has $flag (list "--namespace" "-n" "--all-namespaces" "-A" "--standalone" "--peering" "--priority" "--liveness" "--metrics-port" "--hf-endpoint" "--no-fetch-hf-config") -}}
{{- fail (printf "operator.extraArgs must not set %s: the chart derives it from rbac.scope, operator.replicas, operator.healthPort, operator.metricsPort or operator.huggingFace" $flag) -}}
{{- end -}}
{{- end -}}
{{- if and (include "pagedinfer.monitoring.enabled" .) (not (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1")) -}}
{{- fail "monitoring.*.enabled needs the prometheus-operator CRDs (monitoring.coreos.com/v1), which this cluster does not serve: install prometheus-operator (or kube-prometheus-stack) first, or turn the monitoring values off. With `helm template`, pass --api-versions monitoring.coreos.com/v1" -}}
{{- end -}}
{{- end -}}
