"""pagedinfer.operator: the kopf control plane for InferenceServices. Imports no torch.

The top is thin: `handlers` (the kopf handlers on InferenceServices),
`child_events` and `config_map_events` (the handlers on what they own and
read), `reconciler` (one reconcile: parse, plan, build, apply, report),
`indexes` (kopf indexes of nodes and referenced ConfigMaps), `settings`
(startup, login, the Runtime), `kube_api` (the small API client), `metrics`
(the operator's own), `registry` (the kopf registry) and `cli`. The work is
done in rooms: `spec` (the CRD's model and parsing), `kv_plan` (cluster
facts -> the KV-cache plan), `children` (the engine's Deployment and
Service: build, apply, drift), `status` (conditions, phase, the status
writer), `autoscaling` and `routing`. Rooms import no handler module, except
`autoscaling.daemon`, which is the autoscaler's own kopf daemon.
"""
