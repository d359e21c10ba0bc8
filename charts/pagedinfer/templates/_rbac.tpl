{{/*
The operator's RBAC rules, in one place. Least privilege: exactly the verbs
on exactly the resources the operator calls (tests/chart/test_rbac.py runs
the real operator against an API server that enforces these rules and
nothing more, and fails on any 403).

"pagedinfer.rbac.namespacedRules" go into a ClusterRole (rbac.scope=cluster)
or a Role in the release namespace (rbac.scope=namespace).
"pagedinfer.rbac.clusterRules" are about cluster-scoped objects, so they are
always in a ClusterRole.
*/}}

{{- define "pagedinfer.rbac.namespacedRules" -}}
# The custom resource: watched, patched (kopf's finalizer and progress
# annotations, spec.replicas from the autoscaler), and its status written.
# With scale to zero (minReplicas: 0) the operator also grants a router
# get and patch on its own InferenceService (by resourceNames: the demand
# annotation), which it may only grant because it holds them here.
- apiGroups: ["serving.pagedinfer.dev"]
  resources: ["inferenceservices"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["serving.pagedinfer.dev"]
  resources: ["inferenceservices/status"]
  verbs: ["patch"]
# The autoscaler writes spec.replicas through the scale subresource (the
# field an HPA would drive).
- apiGroups: ["serving.pagedinfer.dev"]
  resources: ["inferenceservices/scale"]
  verbs: ["patch"]
# The engine Deployment and Service of each InferenceService (owned by it,
# so Kubernetes' garbage collector deletes them; the operator never does).
# Both are watched: one deleted or edited by hand is put back, and a
# Deployment's readiness goes into the owner's status.
# With spec.router the operator also runs a router Deployment, the engines'
# headless Service and the router's ServiceAccount, Role and RoleBinding
# (watched and repaired alike), and deletes them when the router is turned
# off (docs/router.md "On Kubernetes").
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["services", "serviceaccounts"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# The routers' Role grants list on EndpointSlices; Kubernetes lets the
# operator grant only what it holds itself (RBAC escalation prevention).
- apiGroups: ["discovery.k8s.io"]
  resources: ["endpointslices"]
  verbs: ["list"]
# The routers' Role also grants patch on pods/status (with warm-up on they set
# the engine pods' pagedinfer.io/warmed condition, their readiness gate); the
# operator sets it itself while no router pod is ready (reason NoRouter).
- apiGroups: [""]
  resources: ["pods/status"]
  verbs: ["patch"]
# The autoscaler lists an InferenceService's ready engine pods to scrape them,
# and before scaling in marks each with controller.kubernetes.io/pod-deletion-cost.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "patch"]
# A model's config.json referenced by spec.model.configMapRef: read when
# sizing, and watched so that a service whose ConfigMap was missing or
# invalid is sized again when it is created or fixed.
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "list", "watch"]
# kopf posts warnings as Events; the reconciler and autoscaler post their own.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- if and (include "pagedinfer.peering.enabled" .) (eq .Values.rbac.scope "namespace") }}
# kopf peering between the operator replicas (namespaced operator).
- apiGroups: ["kopf.dev"]
  resources: ["kopfpeerings"]
  verbs: ["get", "list", "watch", "patch"]
{{- end }}
{{- end -}}

{{- define "pagedinfer.rbac.clusterRules" -}}
# Sizing reads the nodes' GPU memory and product (GPU Feature Discovery
# labels) from an index kopf keeps by listing and watching the nodes.
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["list", "watch"]
{{- if and (include "pagedinfer.peering.enabled" .) (eq .Values.rbac.scope "cluster") }}
# kopf peering between the operator replicas (cluster-wide operator).
- apiGroups: ["kopf.dev"]
  resources: ["clusterkopfpeerings"]
  verbs: ["get", "list", "watch", "patch"]
{{- end }}
{{- end -}}
