"""Parsing and validation of an InferenceService spec into `crd_model`'s dataclasses.

`parse_spec(name, spec)` is the one gate between what a user applied and what
the operator acts on. It checks everything the CRD's OpenAPI schema and CEL
rules check (not every cluster enforces them: validation webhooks can be
off, `kubectl apply --validate=false` exists, old API servers skip CEL), and
raises `SpecError` (a ValueError) listing every problem, each prefixed by
the dotted path of the field (`spec.engine.blockSize: ...`). That includes
every rule of `spec.autoscaling` (`autoscaling.spec.parse_autoscaling_spec`,
the parse the autoscaler itself runs): a spec it would refuse is invalid, and of
`spec.router` (`routing.spec.parse_router_spec`).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from typing import Any

from pagedinfer.contracts import sizing
from pagedinfer.contracts.model_shape import CONFIG_FIELD_BOUNDS
from pagedinfer.operator.autoscaling.spec import AutoscalingSpec, AutoscalingSpecError, parse_autoscaling_spec
from pagedinfer.operator.routing.spec import RouterSpec, RouterSpecError, parse_router_spec
from pagedinfer.operator.spec.crd_model import (
    DTYPES,
    HF_TOKEN_ENV,
    MANAGED_FLAGS,
    MAX_NAME_LENGTH,
    MODEL_SCHEMES,
    RESERVED_ENV,
    TENSOR_PARALLEL_SIZES,
    Architecture,
    ConfigMapRef,
    EngineSpec,
    InferenceServiceSpec,
    KVOffloadSpec,
    ModelSpec,
    ModelUri,
    ResourcesSpec,
    SecretKeyRef,
    SpecError,
)
from pagedinfer.operator.spec.quantity import QUANTITY_PATTERN, quantity_bytes, whole_bytes

# The name grammars the API server and the Hub use; the fields they check are named where they are read.
_DNS_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_DNS_1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_ENV_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")
_HF_REPO = re.compile(r"[A-Za-z0-9][-._A-Za-z0-9]*/[A-Za-z0-9][-._A-Za-z0-9]*")

# spec.model.architecture's fields and the config.json fields whose bounds (sizing) they share.
ARCHITECTURE_FIELDS = {
    "numLayers": "num_hidden_layers",
    "numKVHeads": "num_key_value_heads",
    "headDim": "head_dim",
    "numParameters": "num_parameters",
    "hiddenSize": "hidden_size",
    "maxPositionEmbeddings": "max_position_embeddings",
}


class _Reader:
    """Typed field access that records problems instead of stopping at the first one."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def fail(self, path: str, message: str) -> None:
        self.problems.append(f"{path}: {message}")

    def mapping(self, raw: Any, path: str) -> Mapping[str, Any]:
        if raw is None:
            return {}
        if not isinstance(raw, Mapping):
            self.fail(path, f"must be an object, got {type(raw).__name__}")
            return {}
        return raw

    def integer(
        self,
        raw: Mapping[str, Any],
        key: str,
        path: str,
        default: int | None,
        *,
        minimum: int | None = None,
        maximum: int | None = None,
    ) -> int | None:
        value = raw.get(key, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(f"{path}.{key}", f"must be an integer, got {value!r}")
            return default
        if minimum is not None and value < minimum:
            self.fail(f"{path}.{key}", f"must be >= {minimum}, got {value}")
        if maximum is not None and value > maximum:
            self.fail(f"{path}.{key}", f"must be <= {maximum}, got {value}")
        return value

    def number(self, raw: Mapping[str, Any], key: str, path: str, default: float) -> float:
        value = raw.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            self.fail(f"{path}.{key}", f"must be a number, got {value!r}")
            return default
        return float(value)

    def boolean(self, raw: Mapping[str, Any], key: str, path: str, default: bool) -> bool:
        value = raw.get(key, default)
        if not isinstance(value, bool):
            self.fail(f"{path}.{key}", f"must be true or false, got {value!r}")
            return default
        return value

    def string(
        self,
        raw: Mapping[str, Any],
        key: str,
        path: str,
        default: str | None,
        *,
        choices: tuple[str, ...] | None = None,
        pattern: re.Pattern[str] | None = None,
        max_length: int | None = None,
    ) -> str | None:
        value = raw.get(key, default)
        if value is None:
            return None
        if not isinstance(value, str) or not value:
            self.fail(f"{path}.{key}", f"must be a non-empty string, got {value!r}")
            return default
        if choices is not None and value not in choices:
            self.fail(f"{path}.{key}", f"must be one of {', '.join(choices)}, got {value!r}")
        if pattern is not None and not pattern.fullmatch(value):
            self.fail(f"{path}.{key}", f"{value!r} does not match {pattern.pattern}")
        if max_length is not None and len(value) > max_length:
            self.fail(f"{path}.{key}", f"must be at most {max_length} characters, got {len(value)}")
        return value

    def objects(self, raw: Mapping[str, Any], key: str, path: str) -> tuple[Mapping[str, Any], ...]:
        value = raw.get(key) or []
        if not isinstance(value, list) or not all(isinstance(item, Mapping) for item in value):
            self.fail(f"{path}.{key}", "must be a list of objects")
            return ()
        return tuple(value)


def parse_model_uri(uri: str) -> ModelUri:
    """Split a model URI; ValueError says which form was expected."""
    scheme, sep, rest = uri.partition("://")
    if not sep or scheme not in MODEL_SCHEMES:
        raise ValueError(f"{uri!r} must start with one of {', '.join(s + '://' for s in MODEL_SCHEMES)}")
    if scheme == "hf":
        if not _HF_REPO.fullmatch(rest):
            raise ValueError(f"{uri!r}: expected hf://<org>/<name>")
        return ModelUri(raw=uri, scheme=scheme, repo_id=rest)
    if scheme == "pvc":
        claim, _, path = rest.partition("/")
        if not _DNS_1123_SUBDOMAIN.fullmatch(claim) or ".." in path.split("/"):
            raise ValueError(f"{uri!r}: expected pvc://<claim-name>/<path inside the claim>")
        return ModelUri(raw=uri, scheme=scheme, claim_name=claim, path=path.strip("/"))
    if scheme == "file":
        if not rest.startswith("/") or rest == "/" or ".." in rest.split("/"):
            raise ValueError(f"{uri!r}: expected file:///<absolute directory on the node>")
        return ModelUri(raw=uri, scheme=scheme, path=rest.rstrip("/"))
    if not rest or rest.startswith("/"):
        raise ValueError(f"{uri!r}: expected s3://<bucket>/<key>")
    return ModelUri(raw=uri, scheme=scheme)


def _name_and_key(r: _Reader, raw: Any, path: str, default_key: str) -> tuple[str, str] | None:
    """(name, key) of a reference to a ConfigMap or Secret key; None (a problem recorded) without a name."""
    ref = r.mapping(raw, path)
    name = r.string(ref, "name", path, None, pattern=_DNS_1123_SUBDOMAIN)
    key = r.string(ref, "key", path, default_key)
    if name is None:
        r.fail(f"{path}.name", "is required")
        return None
    return name, key or default_key


def _parse_model(r: _Reader, raw: Mapping[str, Any]) -> ModelSpec:
    path = "spec.model"
    model = r.mapping(raw, path)
    uri = None
    uri_text = r.string(model, "uri", path, None)
    if uri_text is not None:
        try:
            uri = parse_model_uri(uri_text)
        except ValueError as exc:
            r.fail(f"{path}.uri", str(exc))
    architecture = None
    if "architecture" in model:
        arch = r.mapping(model["architecture"], f"{path}.architecture")
        apath = f"{path}.architecture"
        for key in ("numLayers", "numKVHeads", "headDim", "numParameters"):
            if key not in arch:
                r.fail(f"{apath}.{key}", "is required")
        values = {
            key: r.integer(arch, key, apath, None, minimum=1, maximum=CONFIG_FIELD_BOUNDS[field])
            for key, field in ARCHITECTURE_FIELDS.items()
        }
        if all(values[k] is not None for k in ("numLayers", "numKVHeads", "headDim", "numParameters")):
            architecture = Architecture(
                num_layers=values["numLayers"],
                num_kv_heads=values["numKVHeads"],
                head_dim=values["headDim"],
                num_parameters=values["numParameters"],
                hidden_size=values["hiddenSize"],
                max_position_embeddings=values["maxPositionEmbeddings"],
            )
    config_map_ref = None
    if "configMapRef" in model:
        named = _name_and_key(r, model["configMapRef"], f"{path}.configMapRef", "config.json")
        config_map_ref = ConfigMapRef(*named) if named else None
    if "architecture" in model and "configMapRef" in model:
        r.fail(path, "set at most one of architecture and configMapRef")
    cache_claim = r.string(model, "cacheClaimName", path, None, pattern=_DNS_1123_SUBDOMAIN)
    allow_download = r.boolean(model, "allowDownload", path, False)
    hf = uri is not None and uri.scheme == "hf"
    if hf and not allow_download and cache_claim is None:
        r.fail(
            path,
            f"{uri.raw} needs allowDownload: true (the pods download it into their cache) or "
            "cacheClaimName (a PersistentVolumeClaim already holding it in the Hugging Face cache "
            "layout): with neither, the pods run offline (HF_HUB_OFFLINE=1) over an empty cache "
            "and can never load it",
        )
    token = None
    if "hfTokenSecretRef" in model:
        named = _name_and_key(r, model["hfTokenSecretRef"], f"{path}.hfTokenSecretRef", "token")
        token = SecretKeyRef(*named) if named else None
        if not hf:
            r.fail(f"{path}.hfTokenSecretRef", "is for hf:// models only (it becomes the pods' HF_TOKEN)")
    return ModelSpec(
        uri=uri,
        dtype=r.string(model, "dtype", path, "auto", choices=DTYPES) or "auto",
        architecture=architecture,
        config_map_ref=config_map_ref,
        revision=r.string(model, "revision", path, "main", max_length=255) or "main",
        allow_download=allow_download,
        cache_claim_name=cache_claim,
        hf_token_secret_ref=token,
    )


def managed_flag_of(arg: str) -> str | None:
    """The flag of MANAGED_FLAGS that an extraArgs entry would set, or None.

    An entry starting with `--` is a flag, named by what stands before any
    `=`. It sets a managed flag when it is that flag or any prefix of one:
    argparse takes an unambiguous prefix for the whole flag (`--api-k` for
    `--api-key`) unless a parser turns that off, as `pagedinfer serve` does,
    and an image of the engine built before that may not. No other flag of
    `pagedinfer serve` is a prefix of a managed one, so nothing valid is
    refused (tests/operator/test_engine_flags_contract.py checks both).
    """
    if not arg.startswith("--"):
        return None
    name = arg.partition("=")[0]
    if name in MANAGED_FLAGS:
        return name
    return next((flag for flag in MANAGED_FLAGS if flag.startswith(name)), None)


def _parse_engine(r: _Reader, raw: Any) -> EngineSpec:
    path = "spec.engine"
    engine = r.mapping(raw, path)
    d = EngineSpec()  # the defaults: the engine's own (crd_model._engine)
    block_size = r.integer(engine, "blockSize", path, d.block_size)
    if block_size not in sizing.VALID_BLOCK_SIZES:
        r.fail(
            f"{path}.blockSize", f"must be one of {', '.join(map(str, sizing.VALID_BLOCK_SIZES))}, got {block_size!r}"
        )
    util = r.number(engine, "gpuMemoryUtilization", path, d.gpu_memory_utilization)
    if not 0.0 < util <= 1.0:
        r.fail(f"{path}.gpuMemoryUtilization", f"must be in (0, 1], got {util}")
    swap = r.number(engine, "swapSpaceGiB", path, d.swap_space_gib)
    if swap < 0:
        r.fail(f"{path}.swapSpaceGiB", f"must be >= 0, got {swap}")
    extra = engine.get("extraArgs") or []
    if not isinstance(extra, list) or not all(isinstance(a, str) for a in extra):
        r.fail(f"{path}.extraArgs", "must be a list of strings")
        extra = []
    for i, arg in enumerate(extra):
        flag = managed_flag_of(arg)
        if flag is not None:
            name, value = arg.partition("=")[::2]
            shown = f"{name}=..." if value else name  # a value may be a secret: never echoed
            verb = "is" if name == flag else "abbreviates"
            r.fail(
                f"{path}.extraArgs[{i}]",
                f"{shown!r} {verb} {flag}, which the operator sets from the spec; use the spec field",
            )
    env = r.objects(engine, "env", path)
    for i, item in enumerate(env):
        name = item.get("name")
        if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
            r.fail(f"{path}.env[{i}].name", f"must be a valid environment variable name, got {name!r}")
        elif name in RESERVED_ENV:
            r.fail(f"{path}.env[{i}].name", f"{name} is set by the operator")
    api_key = None
    if "apiKeySecretRef" in engine:
        named = _name_and_key(r, engine["apiKeySecretRef"], f"{path}.apiKeySecretRef", "api-key")
        api_key = SecretKeyRef(*named) if named else None
    spec = EngineSpec(
        image=r.string(engine, "image", path, None, max_length=512),
        block_size=block_size if block_size in sizing.VALID_BLOCK_SIZES else d.block_size,
        gpu_memory_utilization=util,
        max_model_len=r.integer(engine, "maxModelLen", path, d.max_model_len, minimum=1),
        max_num_seqs=r.integer(engine, "maxNumSeqs", path, d.max_num_seqs, minimum=1) or d.max_num_seqs,
        max_num_batched_tokens=r.integer(engine, "maxNumBatchedTokens", path, d.max_num_batched_tokens, minimum=1)
        or d.max_num_batched_tokens,
        enable_prefix_caching=r.boolean(engine, "enablePrefixCaching", path, d.enable_prefix_caching),
        enable_chunked_prefill=r.boolean(engine, "enableChunkedPrefill", path, d.enable_chunked_prefill),
        swap_space_gib=swap,
        tensor_parallel_size=r.integer(engine, "tensorParallelSize", path, d.tensor_parallel_size, minimum=1)
        or d.tensor_parallel_size,
        num_gpu_blocks_override=r.integer(engine, "numGpuBlocksOverride", path, d.num_gpu_blocks_override, minimum=1),
        max_cudagraph_capture_size=r.integer(
            engine, "maxCudagraphCaptureSize", path, d.max_cudagraph_capture_size, minimum=0
        )
        or 0,
        kv_offload=_parse_kv_offload(r, engine, path),
        extra_args=tuple(extra),
        env=env,
        api_key_secret_ref=api_key,
    )
    if spec.kv_offload is not None and not spec.enable_prefix_caching:
        r.fail(
            f"{path}.kvOffload", "the host tier keeps the prefix cache's evicted blocks: it needs enablePrefixCaching"
        )
    if spec.max_num_batched_tokens < spec.max_num_seqs:
        r.fail(
            f"{path}.maxNumBatchedTokens",
            f"must be >= maxNumSeqs ({spec.max_num_seqs}), got {spec.max_num_batched_tokens}",
        )
    if (
        not spec.enable_chunked_prefill
        and spec.max_model_len is not None
        and spec.max_num_batched_tokens < spec.max_model_len
    ):
        r.fail(
            f"{path}.maxNumBatchedTokens",
            f"must be >= maxModelLen ({spec.max_model_len}) when "
            f"enableChunkedPrefill is false, got {spec.max_num_batched_tokens}",
        )
    return spec


def _parse_kv_offload(r: _Reader, engine: Mapping[str, Any], path: str) -> KVOffloadSpec | None:
    """spec.engine.kvOffload: a quantity of bytes ("8Gi"), or a percentage of the node's allocatable memory."""
    text = r.string(engine, "kvOffload", path, None, max_length=32)
    if text is None:
        return None
    where = f"{path}.kvOffload"
    if text.endswith("%"):
        try:
            percent = float(text[:-1])
        except ValueError:
            percent = -1.0
        if not 0 < percent < 100:
            r.fail(where, f"a percentage of the node's allocatable memory must be in (0%, 100%), got {text!r}")
            return None
        return KVOffloadSpec(text, node_memory_fraction=percent / 100)
    if not QUANTITY_PATTERN.fullmatch(text):
        r.fail(
            where, f"must be a memory quantity (e.g. 8Gi) or a percentage of the node's memory (e.g. 25%), got {text!r}"
        )
        return None
    size = quantity_bytes(text)
    if not 0 < size <= sizing.MAX_MEMORY_BYTES:
        r.fail(where, f"must be more than 0 and at most 1Pi, got {text!r}")
        return None
    return KVOffloadSpec(text, size_bytes=size)


def _parse_resources(r: _Reader, raw: Any) -> ResourcesSpec:
    path = "spec.resources"
    res = r.mapping(raw, path)
    gpu_memory = None
    if res.get("gpuMemory") is not None:
        try:  # a Kubernetes quantity, as every other size in the spec (`resources.memory`)
            gpu_memory = whole_bytes(res["gpuMemory"])
            if not 0 < gpu_memory <= sizing.MAX_MEMORY_BYTES:
                r.fail(f"{path}.gpuMemory", f"must be more than 0 and at most 1Pi, got {res['gpuMemory']!r}")
        except ValueError as exc:
            r.fail(f"{path}.gpuMemory", str(exc))
    cpu = r.string(res, "cpu", path, None, pattern=QUANTITY_PATTERN)
    memory = r.string(res, "memory", path, None, pattern=QUANTITY_PATTERN)
    memory_bytes = quantity_bytes(memory) if memory is not None and QUANTITY_PATTERN.fullmatch(memory) else None
    return ResourcesSpec(
        gpus=r.integer(res, "gpus", path, None, minimum=0, maximum=16),
        gpu_product=r.string(res, "gpuProduct", path, None, max_length=63),
        gpu_memory_bytes=gpu_memory,
        cpu=cpu,
        memory=memory,
        memory_bytes=memory_bytes,
    )


def parse_spec(name: str, spec: Mapping[str, Any] | None, allow_host_path_models: bool = False) -> InferenceServiceSpec:
    """Validate a whole `spec`; raise SpecError listing every problem found.

    `file://` models become hostPath volumes, which let whoever may create an
    InferenceService read any node directory: refused unless the operator runs
    with --allow-host-path-models.
    """
    r = _Reader()
    if not isinstance(name, str) or not _DNS_1035.fullmatch(name) or len(name) > MAX_NAME_LENGTH:
        r.fail(
            "metadata.name",
            f"must be a DNS-1035 label of at most {MAX_NAME_LENGTH} characters "
            f"(lowercase letters, digits, '-', starting with a letter), got {name!r}",
        )
    raw = r.mapping(spec, "spec")
    model = _parse_model(r, raw.get("model"))
    if model.uri is not None and model.uri.scheme == "s3":
        r.fail(
            "spec.model.uri",
            "s3:// is reserved: the engine cannot read object storage yet; copy the model"
            " into a PersistentVolumeClaim and use pvc://<claim>/<path>",
        )
    if model.uri is not None and model.uri.scheme == "file" and not allow_host_path_models:
        r.fail(
            "spec.model.uri",
            "file:// mounts a node directory (hostPath), which this operator refuses"
            " unless started with --allow-host-path-models; use pvc://<claim>/<path>",
        )
    engine = _parse_engine(r, raw.get("engine"))
    if model.hf_token_secret_ref is not None:
        for i, item in enumerate(engine.env):
            if item.get("name") == HF_TOKEN_ENV:
                r.fail(f"spec.engine.env[{i}].name", f"{HF_TOKEN_ENV} is set from spec.model.hfTokenSecretRef")
    resources = _parse_resources(r, raw.get("resources"))
    node_selector = r.mapping(raw.get("nodeSelector"), "spec.nodeSelector")
    if not all(isinstance(v, str) for v in node_selector.values()):
        r.fail("spec.nodeSelector", "values must be strings")
    tolerations = r.objects(raw, "tolerations", "spec")
    affinity = r.mapping(raw.get("affinity"), "spec.affinity") or None
    replicas = r.integer(raw, "replicas", "spec", 1, minimum=0)
    min_replicas = r.integer(raw, "minReplicas", "spec", 0, minimum=0)
    max_replicas = r.integer(raw, "maxReplicas", "spec", None, minimum=1)
    if min_replicas is not None and max_replicas is not None and min_replicas > max_replicas:
        r.fail("spec.minReplicas", f"must be <= maxReplicas ({max_replicas}), got {min_replicas}")
    autoscaling: AutoscalingSpec | None = None
    try:
        autoscaling = parse_autoscaling_spec(raw, bounds_checked=True)
    except AutoscalingSpecError as exc:
        r.problems.extend(exc.problems)
    router = RouterSpec()
    try:
        router = parse_router_spec(raw.get("router"), max_replicas)
    except RouterSpecError as exc:
        r.problems.extend(exc.problems)
    tp = engine.tensor_parallel_size
    if tp not in TENSOR_PARALLEL_SIZES:
        r.fail("spec.engine.tensorParallelSize", f"must be one of {list(TENSOR_PARALLEL_SIZES)}, got {tp}")
    if resources.gpus is None:  # defaults to one GPU per rank
        resources = dataclasses.replace(resources, gpus=tp)
    if resources.gpus == 0 and tp != 1:
        r.fail("spec.engine.tensorParallelSize", "must be 1 when spec.resources.gpus is 0 (CPU engine)")
    if resources.gpus and tp != resources.gpus:
        r.fail(
            "spec.engine.tensorParallelSize",
            f"must equal spec.resources.gpus ({resources.gpus}): each rank uses one GPU of the pod, got {tp}",
        )
    if model.architecture and model.architecture.num_kv_heads % engine.tensor_parallel_size:
        r.fail(
            "spec.engine.tensorParallelSize",
            f"{engine.tensor_parallel_size} does not divide "
            f"spec.model.architecture.numKVHeads "
            f"({model.architecture.num_kv_heads})",
        )
    if r.problems:
        raise SpecError(r.problems)
    return InferenceServiceSpec(
        name=name,
        model=model,
        engine=engine,
        resources=resources,
        node_selector=dict(node_selector),
        tolerations=tolerations,
        affinity=affinity,
        replicas=replicas if replicas is not None else 1,
        min_replicas=min_replicas or 0,
        max_replicas=max_replicas,
        autoscaling=autoscaling,
        router=router,
    )
