"""pagedinfer.operator.routing: the router in front of an InferenceService's engines (docs/router.md).

- `spec`: `spec.router` parsed and validated (`RouterSpec`), with its defaults;
- `builders`: the router's children as pure manifests (Deployment, ServiceAccount,
  Role, RoleBinding, the engines' headless Service) and the engine flags it needs;
- `children`: applying them with the engine's children, and deleting them when the
  router is turned off;
- `deletion_cost`: cache-preserving scale-in (`controller.kubernetes.io/pod-deletion-cost`).
"""
