{{/*
The operator pod template, shared by the standalone Deployment (replicas: 1)
and the peering StatefulSet (replicas > 1).

Peering: kopf pauses every operator that sees a live peer of higher priority,
and freezes all of them when two share a priority, so each pod needs its own.
StatefulSet pods carry their ordinal in the apps.kubernetes.io/pod-index
label; the downward API turns it into PEERING_PRIORITY and the kubelet expands
$(PEERING_PRIORITY) in the arguments. The highest index acts; the others are
hot standbys that take over when its keep-alive lapses.
*/}}
{{- define "pagedinfer.operator.podTemplate" -}}
metadata:
  labels:
    {{- include "pagedinfer.operator.labels" . | nindent 4 }}
    {{- with .Values.operator.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with .Values.operator.podAnnotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  serviceAccountName: {{ include "pagedinfer.serviceAccountName" . }}
  automountServiceAccountToken: true
  {{- with .Values.operator.imagePullSecrets }}
  imagePullSecrets:
    {{- range . }}
    - name: {{ . }}
    {{- end }}
  {{- end }}
  {{- with .Values.operator.priorityClassName }}
  priorityClassName: {{ . }}
  {{- end }}
  securityContext:
    {{- toYaml .Values.operator.podSecurityContext | nindent 4 }}
  containers:
    - name: operator
      image: {{ include "pagedinfer.image" (list .Values.operator.image .Chart.AppVersion) | quote }}
      imagePullPolicy: {{ .Values.operator.image.pullPolicy }}
      command: ["pagedinfer", "operator"]
      args:
        {{- if eq .Values.rbac.scope "cluster" }}
        - --all-namespaces
        {{- else }}
        - --namespace={{ .Release.Namespace }}
        {{- end }}
        {{- if include "pagedinfer.peering.enabled" . }}
        - --peering={{ include "pagedinfer.peering.name" . }}
        - --priority=$(PEERING_PRIORITY)
        {{- else }}
        - --standalone
        {{- end }}
        - --liveness=0.0.0.0:{{ .Values.operator.healthPort }}
        - --metrics-port={{ .Values.operator.metricsPort }}
        {{- with .Values.operator.huggingFace.endpoint }}
        - --hf-endpoint={{ . }}
        {{- end }}
        {{- if not .Values.operator.huggingFace.fetchConfig }}
        - --no-fetch-hf-config
        {{- end }}
        - --engine-image={{ include "pagedinfer.image" (list .Values.engine.image .Chart.AppVersion) }}
        - --engine-cpu-image={{ include "pagedinfer.image" (list .Values.engine.cpuImage (printf "%s-cpu" .Chart.AppVersion)) }}
        - --router-image={{ include "pagedinfer.image" (list .Values.router.image .Chart.AppVersion) }}
        {{- range .Values.operator.extraArgs }}
        - {{ . | quote }}
        {{- end }}
      env:
        # kopf names itself after the pod in peering objects and events.
        - name: POD_ID
          valueFrom:
            fieldRef:
              fieldPath: metadata.name
        {{- if include "pagedinfer.peering.enabled" . }}
        - name: PEERING_PRIORITY
          valueFrom:
            fieldRef:
              fieldPath: metadata.labels['apps.kubernetes.io/pod-index']
        {{- end }}
        {{- with .Values.operator.huggingFace.tokenSecretRef.name }}
        - name: HF_TOKEN
          valueFrom:
            secretKeyRef:
              name: {{ . }}
              key: {{ $.Values.operator.huggingFace.tokenSecretRef.key }}
        {{- end }}
        {{- with .Values.operator.extraEnv }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      ports:
        - name: health
          containerPort: {{ .Values.operator.healthPort }}
          protocol: TCP
        - name: metrics
          containerPort: {{ .Values.operator.metricsPort }}
          protocol: TCP
      livenessProbe:
        httpGet:
          path: /healthz
          port: health
        initialDelaySeconds: 10
        periodSeconds: 20
        timeoutSeconds: 5
        failureThreshold: 3
      resources:
        {{- toYaml .Values.operator.resources | nindent 8 }}
      securityContext:
        {{- toYaml .Values.operator.containerSecurityContext | nindent 8 }}
      volumeMounts:
        - name: tmp
          mountPath: /tmp
  volumes:
    - name: tmp
      emptyDir:
        sizeLimit: 64Mi
  {{- with .Values.operator.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.operator.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.operator.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}
