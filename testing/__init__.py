"""pagedinfer.testing: a Kubernetes API server, kubelet and operator runtime to test controllers against.

- `kube_emulator`: kmock's emulator with the API-server semantics kopf relies
  on (resourceVersion, generation, /status and /scale, finalizers, watches
  from a resourceVersion, selectors, patches, 409/422), plus RBAC and fault
  hooks; `kube_emulator_rules` holds its pure rules (patches, selectors,
  quantities, the pod spec's canonical form).
- `operator_harness`: the real pagedinfer operator (kopf) over HTTP against
  an emulator on 127.0.0.1, with short timeouts.
- `kubelet_harness` and `pod_process`: a Deployment's pods run as local
  processes on 127.0.0.x, their command line as the kubelet would run it.
- `server_process`: a free port and a wait for a server's /health.
- `watched`: what a wait depends on (the operator's task, the kubelet
  harness's pods): `eventually` fails at once, naming it, when one has died.

Needs the `testing` extra (kmock, kopf, aiohttp). See docs/testing.md.
"""
