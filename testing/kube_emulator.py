"""kmock's KubernetesEmulator with the API-server semantics kopf and the operator rely on.

Stock kmock 0.8 stores objects as merged dicts. This subclass adds, for the
resources registered with `register()`:

- server-set `uid`, `resourceVersion` (one global counter, like etcd),
  `generation` (bumped when anything but metadata/status changes) and
  `creationTimestamp`; `generateName`; 409 AlreadyExists on create;
- merge, strategic-merge (a merge, but pods' status.conditions merged by type) and JSON patches, a failed
  JSON-patch `test` answered with 422 (kopf's finalizer patches start with a
  `test` on `metadata.resourceVersion`); a stale `metadata.resourceVersion`
  in a patch or PUT answered with 409 Conflict; no-op writes change nothing;
- PUT; a real `/status` subresource (writes to the main resource ignore
  `status`, writes to `/status` change only `status`); the `scale`
  subresource (autoscaling/v1 Scale) for resources registered with one;
- pruning by a structural schema (a CRD's openAPIV3Schema, `register(schema=...)`;
  the InferenceService's is crds/'s) on create, update and patch, and the
  `fieldValidation` query parameter (Ignore, Warn: `Warning` headers, the
  default, Strict: 400): `kube_emulator_schema`;
- the canonical form of pod specs (in Pods and in Deployments' templates):
  resource quantities as the API server writes them, empty env values
  dropped (`kube_emulator_rules.canonical_pod_spec`);
- deletion with finalizers (deletionTimestamp, then gone when the last
  finalizer is removed); a pod's graceful deletion (`begin_pod_deletion`:
  deletionTimestamp and deletionGracePeriodSeconds set, the Pod kept until the
  kubelet's final removal, as a DELETE with a grace period does);
- list and watch with `labelSelector` and `fieldSelector`, list
  `metadata.resourceVersion`, watch from a `resourceVersion` (replaying the
  event log), watch `timeoutSeconds`;
- hooks for tests: `authorizer(Access) -> bool` answers 403 per request
  (verb, group, resource, namespace, name, subresource), and `faults`
  inject errors or delays; `calls` records every API request once answered, `arrivals` as it comes.

It has no controllers and no garbage collector: tests play those parts
(`set_status`, `collect_garbage`, `scale_down_pods`: a ReplicaSet's scale-down
order, pod-deletion-cost included) and say so. Discovery (/api, /apis, ...)
is kmock's, from `resources`.
"""

from __future__ import annotations

import asyncio
import bisect
import copy
import dataclasses
import datetime
import json
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import aiohttp.web
import attrs
import kmock
from kmock._internal import rendering

from pagedinfer.operator.children.drift import dig
from pagedinfer.testing.kube_emulator_rules import (
    PatchError,
    SelectorError,
    canonical_pod_spec,
    field_selector,
    gated_pod_readiness,
    json_patch,
    label_selector,
    merge_patch,
    scale_down_order,
    selector_from_match_labels,
    spec_changed,
    strategic_merge_patch,
)
from pagedinfer.testing.kube_emulator_schema import (
    FieldValidationError,
    crd_schema,
    field_validation,
    prune,
    strict_error,
    warning_header,
)


@dataclasses.dataclass(frozen=True)
class Access:
    """One API request in RBAC terms."""

    verb: str  # get list watch create update patch delete deletecollection
    group: str  # "" for the core group
    resource: str  # plural
    namespace: str | None
    name: str | None
    subresource: str | None


def _matching(accesses: Iterable[Access], verb: str | None, resource: str | None) -> int:
    return sum(1 for a in accesses if (verb is None or a.verb == verb) and (resource is None or a.resource == resource))


@dataclasses.dataclass
class Fault:
    """Answer matching requests with `status` (after `delay_seconds`), `times` times (None: forever)."""

    verb: str | None = None
    resource: str | None = None
    subresource: str | None = None
    status: int | None = 500  # None: only delay, then serve normally
    delay_seconds: float = 0.0
    times: int | None = 1
    message: str | None = None  # the Status message (default: says the fault was injected)

    def matches(self, access: Access) -> bool:
        return (
            (self.verb is None or self.verb == access.verb)
            and (self.resource is None or self.resource == access.resource)
            and (self.subresource is None or self.subresource == access.subresource)
        )


@dataclasses.dataclass(frozen=True)
class Kind:
    api_version: str
    kind: str
    namespaced: bool
    subresources: frozenset[str]
    # Scale subresource: paths of spec replicas, status replicas, and the selector (or matchLabels).
    scale_paths: tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]] | None = None
    pod_spec_path: tuple[str, ...] | None = None  # where a pod spec sits, stored in canonical form
    schema: Any = None  # a structural openAPIV3Schema to prune by (kube_emulator_schema); None: nothing pruned


@dataclasses.dataclass
class Validation:
    """One write's `fieldValidation` mode and the unknown fields it warns about (test helpers: Ignore)."""

    mode: str = "Ignore"
    warnings: list[str] = dataclasses.field(default_factory=list)


_REASONS = {
    400: "BadRequest",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
}


class StatusError(Exception):
    """A request the emulated API server refuses: answered as a metav1.Status with `code` (Kubernetes' StatusError)."""

    def __init__(self, code: int, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.reason = code, message, reason or _REASONS.get(code, "Unknown")

    def status(self) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Status",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@attrs.define(kw_only=True)
class KubeEmulator(kmock.KubernetesEmulator):
    authorizer: Callable[[Access], bool] | None = None
    faults: list[Fault] = attrs.field(factory=list)
    calls: list[tuple[Access, int]] = attrs.field(factory=list, init=False)
    arrivals: list[Access] = attrs.field(factory=list, init=False)  # each request as it comes, before any fault
    _kinds: dict[kmock.resource, Kind] = attrs.field(factory=dict, init=False)
    _revision: int = attrs.field(default=0, init=False)
    _log: list[tuple[int, kmock.resource, dict[str, Any]]] = attrs.field(factory=list, init=False)
    _changed: asyncio.Condition = attrs.field(factory=asyncio.Condition, init=False)

    def register(
        self,
        api_version: str,
        kind: str,
        plural: str,
        *,
        namespaced: bool = True,
        subresources: tuple[str, ...] = (),
        scale_paths: Any = None,
        pod_spec_path: tuple[str, ...] | None = None,
        schema: Any = None,
    ) -> kmock.resource:
        group, _, version = api_version.rpartition("/")
        res = kmock.resource(group, version, plural)
        self.resources[res] = kmock.ResourceInfo(
            kind=kind,
            namespaced=namespaced,
            singular=kind.lower(),
            subresources=set(subresources),
            verbs={"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"},
        )
        self._kinds[res] = Kind(
            api_version, kind, namespaced, frozenset(subresources), scale_paths, pod_spec_path, schema
        )
        return res

    # ----------------------------------------------------------------- test helpers (no HTTP)
    def read(self, res: kmock.resource, namespace: str | None, name: str) -> dict[str, Any] | None:
        key = (res, namespace, name)
        if key not in self._objects or self._objects[key].deleted:
            return None
        return copy.deepcopy(self._objects[key].raw)

    def read_all(self, res: kmock.resource, namespace: str | None = None) -> list[dict[str, Any]]:
        return [
            copy.deepcopy(o.raw)
            for (r, ns, _), o in self._objects.items()
            if r == res and not o.deleted and (namespace is None or ns == namespace)
        ]

    async def create(self, res: kmock.resource, body: dict[str, Any]) -> dict[str, Any]:
        async with self._changed:
            return self._create(res, body.get("metadata", {}).get("namespace"), copy.deepcopy(body))

    async def merge(
        self,
        res: kmock.resource,
        namespace: str | None,
        name: str,
        patch: dict[str, Any],
        subresource: str | None = None,
    ) -> dict[str, Any]:
        """What `kubectl patch --type=merge [--subresource=...]` does, without HTTP."""
        async with self._changed:
            return self._write(res, namespace, name, subresource, lambda cur: merge_patch(cur, patch))

    async def set_status(
        self, res: kmock.resource, namespace: str | None, name: str, status: dict[str, Any]
    ) -> dict[str, Any]:
        """Play a controller: merge `status` into the object's status."""
        async with self._changed:
            return self._write(res, namespace, name, "status", lambda cur: merge_patch(cur, {"status": status}))

    async def remove(self, res: kmock.resource, namespace: str | None, name: str) -> None:
        async with self._changed:
            self._delete(res, namespace, name)

    async def begin_pod_deletion(self, namespace: str, name: str) -> dict[str, Any]:
        """A pod's DELETE with its grace period: the Pod stays, terminating, until `remove` (the kubelet's
        final delete once its containers stopped). deletionTimestamp is when the grace period ends."""
        pods = kmock.resource("", "v1", "pods")
        async with self._changed:
            current = self._current(pods, namespace, name)
            meta = current["metadata"]
            if meta.get("deletionTimestamp"):
                return current
            grace = int((current.get("spec") or {}).get("terminationGracePeriodSeconds", 30))
            meta["deletionGracePeriodSeconds"] = grace
            meta["deletionTimestamp"] = (
                datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=grace)
            ).strftime("%Y-%m-%dT%H:%M:%SZ")
            return self._commit(pods, "MODIFIED", current)

    async def collect_garbage(self) -> list[tuple[str, str]]:
        """Play the garbage collector: delete objects whose owners (by uid) no longer exist."""
        async with self._changed:
            uids = {o.raw["metadata"]["uid"] for o in self._objects.values() if not o.deleted}
            collected = []
            for (res, ns, name), obj in list(self._objects.items()):
                refs = [] if obj.deleted else obj.raw["metadata"].get("ownerReferences") or []
                if refs and not any(ref.get("uid") in uids for ref in refs):
                    self._delete(res, ns, name)
                    collected.append((self._kinds[res].kind, name))
            return collected

    async def scale_down_pods(self, namespace: str, match_labels: dict[str, str], replicas: int) -> list[str]:
        """Play the ReplicaSet controller scaling down: delete the pods matching `match_labels` beyond
        `replicas`, in its order (`scale_down_order`: pod-deletion-cost honoured). Returns the deleted names."""
        pods = kmock.resource("", "v1", "pods")
        selected = [
            p
            for p in self.read_all(pods, namespace)
            if all((p["metadata"].get("labels") or {}).get(k) == v for k, v in match_labels.items())
        ]
        doomed = [p["metadata"]["name"] for p in scale_down_order(selected)[: max(0, len(selected) - replicas)]]
        for name in doomed:
            await self.remove(pods, namespace, name)
        return doomed

    def count(self, verb: str | None = None, resource: str | None = None) -> int:
        """Requests answered."""
        return _matching((a for a, _ in self.calls), verb, resource)

    def received(self, verb: str | None = None, resource: str | None = None) -> int:
        """Requests received, answered or not: one a fault holds back (`delay_seconds`) is counted already."""
        return _matching(self.arrivals, verb, resource)

    # ----------------------------------------------------------------- HTTP entry point
    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        res = request.resource
        if res is None or res.plural is None:
            return await kmock.RawHandler._handle(self, request)
        res = kmock.resource(res.group, res.version, res.plural)
        access = self._access(request, res)
        self.arrivals.append(access)
        try:
            if res not in self._kinds:
                raise StatusError(404, f"the server could not find the requested resource ({res.plural})")
            if self.authorizer is not None and not self.authorizer(access):
                scope = f' in the namespace "{access.namespace}"' if access.namespace else " at the cluster scope"
                raise StatusError(
                    403,
                    f"{access.resource}{'.' + access.group if access.group else ''} is forbidden: "
                    f'cannot {access.verb} resource "{access.resource}"'
                    f"{'/' + access.subresource if access.subresource else ''}"
                    f' in API group "{access.group}"{scope}',
                )
            await self._inject_fault(access)
            if access.verb == "watch":
                self.calls.append((access, 200))
                return await self._watch(request, res)
            code, body, warnings = await self._serve(request, res, access)
        except StatusError as exc:
            self.calls.append((access, exc.code))
            return aiohttp.web.json_response(exc.status(), status=exc.code)
        self.calls.append((access, code))
        return aiohttp.web.json_response(
            body, status=code, headers=[("Warning", warning_header(path)) for path in warnings]
        )

    def _access(self, request: rendering.Request, res: kmock.resource) -> Access:
        method, name = str(request.method.value).upper(), request.name
        if method == "GET":
            verb = "watch" if request.params.get("watch") in ("true", "1") else ("get" if name else "list")
        else:
            verb = {
                "POST": "create",
                "PUT": "update",
                "PATCH": "patch",
                "DELETE": "delete" if name else "deletecollection",
            }.get(method, method.lower())
        return Access(verb, res.group or "", res.plural or "", request.namespace, name, request.subresource)

    async def _inject_fault(self, access: Access) -> None:
        for fault in list(self.faults):
            if fault.matches(access):
                if fault.times is not None:
                    fault.times -= 1
                    if fault.times <= 0:
                        self.faults.remove(fault)
                if fault.delay_seconds:
                    await asyncio.sleep(fault.delay_seconds)
                if fault.status is not None:
                    raise StatusError(
                        fault.status,
                        fault.message or f"injected fault: {fault.status} for {access.verb} {access.resource}",
                    )
                return

    async def _serve(
        self, request: rendering.Request, res: kmock.resource, access: Access
    ) -> tuple[int, Any, list[str]]:
        """(status code, body, the unknown fields to warn about)."""
        kind = self._kinds[res]
        sub = request.subresource
        if sub is not None and sub not in kind.subresources:
            raise StatusError(404, f"{res.plural} has no subresource {sub!r}")
        try:
            validation = Validation(field_validation(request.params.get("fieldValidation")))
        except FieldValidationError as exc:
            raise StatusError(400, str(exc)) from None
        async with self._changed:
            if access.verb == "list":
                return 200, self._list(request, res), []
            if access.verb == "get":
                obj = self._current(res, request.namespace, request.name)
                return 200, self._as_scale(kind, obj) if sub == "scale" else obj, []
            if access.verb == "create":
                if not isinstance(request.data, dict):
                    raise StatusError(400, "the request body must be a JSON object")
                return 201, self._create(res, request.namespace, request.data, validation), validation.warnings
            if access.verb in ("update", "patch"):
                transform = self._transform(request, access.verb, kind)
                obj = self._write(res, request.namespace, request.name, sub, transform, validation)
                return 200, self._as_scale(kind, obj) if sub == "scale" else obj, validation.warnings
            if access.verb == "delete":
                return 200, self._delete(res, request.namespace, request.name), []
        raise StatusError(405, f"{access.verb} is not supported on {res.plural}")

    # ----------------------------------------------------------------- state changes (hold _changed)
    def _current(self, res: kmock.resource, namespace: str | None, name: str | None) -> dict[str, Any]:
        key = (res, namespace, name)
        if name is None or key not in self._objects or self._objects[key].deleted:
            raise StatusError(404, f'{res.plural} "{name}" not found', "NotFound")
        return copy.deepcopy(self._objects[key].raw)

    def _commit(self, res: kmock.resource, event_type: str, obj: dict[str, Any]) -> dict[str, Any]:
        self._revision += 1
        obj["metadata"]["resourceVersion"] = str(self._revision)
        meta = obj["metadata"]
        key = (res, meta.get("namespace"), meta["name"])
        if event_type == "DELETED":
            self._objects[key].delete()
        elif key in self._objects:
            self._objects[key].history.append(copy.deepcopy(obj))
        else:
            self._objects[key] = copy.deepcopy(obj)
        self._log.append((self._revision, res, {"type": event_type, "object": copy.deepcopy(obj)}))
        self._changed.notify_all()
        return obj

    def _prune(self, kind: Kind, obj: dict[str, Any], validation: Validation) -> None:
        """Prune `obj` by its kind's schema; Strict refuses unknown fields, Warn collects them."""
        if kind.schema is None:
            return
        dropped = prune(obj, kind.schema)
        if dropped and validation.mode == "Strict":
            version = kind.api_version.rpartition("/")[2]
            raise StatusError(400, strict_error(kind.kind, version, dropped), "BadRequest")
        if validation.mode == "Warn":
            validation.warnings.extend(dropped)

    def _create(
        self, res: kmock.resource, namespace: str | None, body: dict[str, Any], validation: Validation | None = None
    ) -> dict[str, Any]:
        kind = self._kinds[res]
        meta = body.setdefault("metadata", {})
        if kind.namespaced:
            namespace = namespace or meta.get("namespace")
            if not namespace or meta.get("namespace", namespace) != namespace:
                raise StatusError(400, "the namespace of the object does not match the namespace of the request")
            meta["namespace"] = namespace
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise StatusError(422, "metadata.name or metadata.generateName is required")
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        key = (res, meta.get("namespace"), meta["name"])
        if key in self._objects and not self._objects[key].deleted:
            raise StatusError(409, f'{res.plural} "{meta["name"]}" already exists', "AlreadyExists")
        body["apiVersion"], body["kind"] = kind.api_version, kind.kind
        meta.update(uid=str(uuid.uuid4()), generation=1, creationTimestamp=_now())
        if kind.pod_spec_path is not None:
            canonical_pod_spec(dig(body, kind.pod_spec_path))
        meta.pop("deletionTimestamp", None)
        if "status" in kind.subresources:
            body.pop("status", None)
        self._prune(kind, body, validation or Validation())
        return self._commit(res, "ADDED", body)

    def _transform(self, request: rendering.Request, verb: str, kind: Kind) -> Callable[[dict], dict]:
        data = request.data
        if verb == "update":
            if not isinstance(data, dict):
                raise StatusError(400, "the request body must be a JSON object")
            return lambda current: copy.deepcopy(data)
        content_type = request.headers.get("Content-Type", "").split(";")[0].strip()
        if content_type == "application/json-patch+json":
            return lambda current: json_patch(current, data)
        if content_type in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            if not isinstance(data, dict):
                raise StatusError(400, "a merge patch must be a JSON object")
            merge = strategic_merge_patch if content_type.startswith("application/strategic") else merge_patch
            return lambda current: merge(current, data)
        raise StatusError(
            415,
            f"the body of the request was in an unknown format - accepted media types include: "
            f"application/json-patch+json, application/merge-patch+json, "
            f"application/strategic-merge-patch+json (got {content_type!r})",
        )

    def _write(
        self,
        res: kmock.resource,
        namespace: str | None,
        name: str | None,
        sub: str | None,
        transform: Callable[[dict], dict],
        validation: Validation | None = None,
    ) -> dict[str, Any]:
        kind = self._kinds[res]
        current = self._current(res, namespace, name)
        base = self._as_scale(kind, current) if sub == "scale" else current
        try:
            wanted = transform(copy.deepcopy(base))
        except PatchError as exc:
            raise StatusError(422, f"the server rejected our request due to an error in our request: {exc}") from None
        if not isinstance(wanted, dict):
            raise StatusError(422, "the patched object is not a JSON object")
        sent_version = (wanted.get("metadata") or {}).get("resourceVersion")
        if sent_version is not None and sent_version != current["metadata"]["resourceVersion"]:
            raise StatusError(
                409,
                f'Operation cannot be fulfilled on {res.plural} "{name}": the object has been '
                f"modified; please apply your changes to the latest version and try again",
            )
        if sub == "scale":
            replicas = dig(wanted, ("spec", "replicas"))
            if not isinstance(replicas, int) or replicas < 0:
                raise StatusError(422, f"spec.replicas must be a non-negative integer, got {replicas!r}")
            new = copy.deepcopy(current)
            assert kind.scale_paths is not None
            *parents, leaf = kind.scale_paths[0]
            node = new
            for key in parents:
                node = node.setdefault(key, {})
            node[leaf] = replicas
        elif sub == "status":
            new = copy.deepcopy(current)
            new["status"] = wanted.get("status")
            if new["status"] is None:
                new.pop("status")
        else:
            new = wanted
            if "status" in kind.subresources:
                new.pop("status", None)
                if "status" in current:
                    new["status"] = current["status"]
        meta = new.setdefault("metadata", {})
        for field in ("uid", "creationTimestamp", "name", "namespace", "generation", "resourceVersion"):
            if field in current["metadata"]:
                meta[field] = current["metadata"][field]
        if "deletionTimestamp" in current["metadata"]:
            meta["deletionTimestamp"] = current["metadata"]["deletionTimestamp"]
        new["apiVersion"], new["kind"] = kind.api_version, kind.kind
        if kind.pod_spec_path is not None:
            canonical_pod_spec(dig(new, kind.pod_spec_path))
        if kind.kind == "Pod":
            gated_pod_readiness(new)  # the kubelet's status sync, at once
        if sub != "scale":
            self._prune(kind, new, validation or Validation())
        if new == current:
            return current
        if spec_changed(current, new):
            meta["generation"] = int(current["metadata"].get("generation", 1)) + 1
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            return self._commit(res, "DELETED", new)
        return self._commit(res, "MODIFIED", new)

    def _delete(self, res: kmock.resource, namespace: str | None, name: str | None) -> dict[str, Any]:
        current = self._current(res, namespace, name)
        meta = current["metadata"]
        if meta.get("finalizers"):
            if not meta.get("deletionTimestamp"):
                meta["deletionTimestamp"] = _now()
                meta["deletionGracePeriodSeconds"] = 0
                return self._commit(res, "MODIFIED", current)
            return current
        return self._commit(res, "DELETED", current)

    # ----------------------------------------------------------------- reads
    def _as_scale(self, kind: Kind, obj: dict[str, Any]) -> dict[str, Any]:
        if kind.scale_paths is None:
            raise StatusError(404, f"{kind.kind} has no scale subresource")
        spec_path, status_path, selector_path = kind.scale_paths
        selector = dig(obj, selector_path)
        if isinstance(selector, dict):
            selector = selector_from_match_labels(selector)
        meta = obj["metadata"]
        return {
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            "metadata": {
                k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp") if k in meta
            },
            "spec": {"replicas": dig(obj, spec_path) or 0},
            "status": {"replicas": dig(obj, status_path) or 0, **({"selector": selector} if selector else {})},
        }

    def _matcher(self, request: rendering.Request) -> Callable[[dict[str, Any]], bool]:
        try:
            labels = label_selector(request.params.get("labelSelector"))
            fields = field_selector(request.params.get("fieldSelector"))
        except SelectorError as exc:
            raise StatusError(400, str(exc)) from None
        namespace = request.namespace
        return lambda obj: (
            (namespace is None or obj["metadata"].get("namespace") == namespace)
            and labels(obj["metadata"].get("labels") or {})
            and fields(obj)
        )

    def _list(self, request: rendering.Request, res: kmock.resource) -> dict[str, Any]:
        kind = self._kinds[res]
        match = self._matcher(request)
        items = [copy.deepcopy(o.raw) for (r, _, _), o in self._objects.items() if r == res and not o.deleted]
        return {
            "apiVersion": kind.api_version,
            "kind": f"{kind.kind}List",
            "metadata": {"resourceVersion": str(self._revision)},
            "items": [obj for obj in items if match(obj)],
        }

    async def _watch(self, request: rendering.Request, res: kmock.resource) -> aiohttp.web.StreamResponse:
        match = self._matcher(request)
        timeout = float(request.params.get("timeoutSeconds") or 1800)
        since = request.params.get("resourceVersion")
        async with self._changed:
            if since in (None, "", "0"):
                backlog = [{"type": "ADDED", "object": obj} for obj in self._list(request, res)["items"]]
                position = self._revision
            else:
                position = int(since)
                backlog = []
        assert request._raw_request is not None
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request._raw_request)
        deadline = time.monotonic() + timeout
        try:
            for event in backlog:
                await response.write(json.dumps(event).encode() + b"\n")
            raw = request._raw_request
            while (left := deadline - time.monotonic()) > 0:
                # A client that went away is noticed within a second, not at the next
                # write: an idle stream must not hold the server's shutdown.
                if raw.transport is None or raw.transport.is_closing():
                    return response
                async with self._changed:
                    start = bisect.bisect_right(self._log, position, key=lambda entry: entry[0])
                    events = [(rv, e) for rv, r, e in self._log[start:] if r == res]
                    if not events:
                        await wait_changed(self._changed, min(left, 1.0))
                        continue
                for rv, event in events:
                    position = rv
                    if match(event["object"]):
                        await response.write(json.dumps(event).encode() + b"\n")
        except (ConnectionResetError, RuntimeError):
            return response
        await response.write_eof()
        return response


async def wait_changed(changed: asyncio.Condition, timeout_seconds: float) -> None:
    """Wait on `changed` (held) for a notify or the timeout, and hold it again on return, however it returns.

    In this task, under `asyncio.timeout`, not `asyncio.wait_for`: on Python 3.11 wait_for runs the wait
    in a task of its own, and a watch cancelled while that task re-acquires the lock after a timeout
    (kopf stopping, the server's shutdown) leaves it behind: the watch's `async with` releases a lock it
    does not hold (another holder's, or none: RuntimeError), and the orphaned wait then acquires it for
    ever, so every later watch and write blocks on it. Here the re-acquire and the release are the same
    task's, whatever cancels it."""
    try:
        async with asyncio.timeout(timeout_seconds):
            await changed.wait()
    except TimeoutError:
        pass


def default_emulator(**kwargs: Any) -> KubeEmulator:
    """An emulator serving the core, apps and InferenceService resources the operator uses.

    InferenceServices are pruned by crds/inferenceservices.yaml's schema, as a real API server would."""
    emulator = KubeEmulator(**kwargs)
    emulator.register("v1", "Node", "nodes", namespaced=False, subresources=("status",))
    emulator.register("v1", "Namespace", "namespaces", namespaced=False, subresources=("status",))
    emulator.register("v1", "ConfigMap", "configmaps")
    emulator.register("v1", "Secret", "secrets")
    emulator.register("v1", "Service", "services", subresources=("status",))
    emulator.register("v1", "Event", "events")
    emulator.register("v1", "ServiceAccount", "serviceaccounts")
    emulator.register("rbac.authorization.k8s.io/v1", "Role", "roles")
    emulator.register("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings")
    emulator.register("v1", "Pod", "pods", subresources=("status",), pod_spec_path=("spec",))
    emulator.register(
        "apps/v1",
        "Deployment",
        "deployments",
        subresources=("status", "scale"),
        scale_paths=(("spec", "replicas"), ("status", "replicas"), ("spec", "selector", "matchLabels")),
        pod_spec_path=("spec", "template", "spec"),
    )
    emulator.register(
        "serving.pagedinfer.dev/v1alpha1",
        "InferenceService",
        "inferenceservices",
        subresources=("status", "scale"),
        schema=crd_schema(),
        scale_paths=(("spec", "replicas"), ("status", "replicas"), ("status", "selector")),
    )
    return emulator
