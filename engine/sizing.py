"""KV-cache sizing: how many KV blocks fit on one GPU.

Pure functions, no torch and no I/O: the engine calls them after profiling a
forward pass, the operator calls them from node labels before any pod
exists, and `pagedinfer plan` calls them from a config.json. For the same
inputs all three give the same answer.

The rule (per GPU, tensor parallelism splits weights and KV heads):

    bytes_per_token = 2 (K and V) x num_layers x (num_kv_heads / tp) x head_dim x dtype_bytes
    bytes_per_block = bytes_per_token x block_size
    usable_bytes    = gpu_memory_bytes x gpu_memory_utilization
                      - weight_bytes / tp - activation_reserve_bytes
    num_gpu_blocks  = floor(usable_bytes / bytes_per_block)

Known answer: Llama-3-8B (32 layers, 8 KV heads, head_dim 128, bf16) needs
128 KiB per token and 2 MiB per 16-token block.

The activation reserve is measured by the engine's profiling pass when one
ran; otherwise (operator, `plan`) it is estimated by
`estimate_activation_reserve_bytes`, which grows with max_num_batched_tokens.

The dtype (weights, activations and KV cache alike) is `resolve_dtype`'s
answer for the device the engine runs on; the engine maps it to a torch
dtype, so the three callers size the same pool. A config.json is read once,
by `ModelShape.from_hf_config`, which checks every shape field it uses is an
integer in [1, its bound in CONFIG_FIELD_BOUNDS] and raises
`InvalidModelConfigError` naming the field and its value otherwise.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Mapping

VALID_BLOCK_SIZES = (8, 16, 32, 64, 128)
DEVICE_TYPES = ("cpu", "cuda")
# The dtypes the engine runs a model in (EngineConfig's --dtype choices besides auto).
ENGINE_DTYPES = ("float32", "float16", "bfloat16")
# What dtype auto means when config.json names none: bfloat16 on a GPU (as vLLM and
# every recent checkpoint); float32 on a CPU, where half-precision matmuls are slow.
DEFAULT_DTYPE = {"cuda": "bfloat16", "cpu": "float32"}
# No GPU, MIG slice or CPU budget is larger than this (1 PiB): a bigger size is a typo.
MAX_MEMORY_BYTES = 2**50
# Upper bounds of the config.json fields sizing reads. Far above any published model
# (about 200 layers, 128 heads, hidden 32k, vocab 256k, 10M positions), low enough that
# a typo such as 1e9 layers is caught instead of sizing nonsense.
CONFIG_FIELD_BOUNDS = {
    "num_hidden_layers": 10_000,
    "hidden_size": 2**20,
    "num_attention_heads": 2**16,
    "num_key_value_heads": 2**16,
    "head_dim": 2**16,
    "intermediate_size": 2**24,
    "vocab_size": 2**24,
    "max_position_embeddings": 2**32,
    "num_parameters": 10**15,
}

_DTYPE_BYTES = {
    "float32": 4, "fp32": 4, "float": 4,
    "float16": 2, "fp16": 2, "half": 2,
    "bfloat16": 2, "bf16": 2,
    "float8": 1, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1,
}

# Memory the runtime needs whatever the batch: CUDA context, cuBLAS/Triton
# workspaces, allocator fragmentation, the sampler's logits. 1 GiB matches what
# vLLM leaves outside its profiled peak on a single GPU.
FIXED_OVERHEAD_BYTES = 1 << 30
# Peak live activations of one token in a forward pass, in units of
# hidden_size x dtype_bytes (residual, normed input, q/k/v, attention output,
# gate/up/act of the MLP at ~3.5 x hidden each). A deliberate over-estimate.
ACTIVATION_HIDDEN_MULTIPLE = 16

_UNITS = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12, "tb": 10**12,
    "ki": 2**10, "kib": 2**10, "mi": 2**20, "mib": 2**20, "gi": 2**30, "gib": 2**30, "ti": 2**40, "tib": 2**40,
}


class InsufficientMemoryError(ValueError):
    """Raised when no KV block, or not one max_model_len sequence, fits."""


class InvalidModelConfigError(ValueError):
    """A config.json that cannot describe a model; `field` and `value` say which entry and what it held."""

    def __init__(self, field: str, value: Any, expected: str) -> None:
        got = "" if value is None else f", got {value!r}"
        super().__init__(f"config.json: {field} {expected}{got}")
        self.field, self.value = field, value


def parse_bytes(value: str | int | float, *, name: str = "memory") -> int:
    """Parse '80GiB', '81559Mi', '80G', '1.5e9' or a number of bytes."""
    if isinstance(value, bool):
        raise ValueError(f"{name}: expected a size such as '80GiB', got {value!r}")
    if isinstance(value, (int, float)):
        size = float(value)
    else:
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*", str(value))
        if match is None or match.group(2).lower() not in _UNITS:
            raise ValueError(f"{name}: cannot parse {value!r} as a size (examples: 80GiB, 81559Mi, 40G)")
        size = float(match.group(1)) * _UNITS[match.group(2).lower()]
    if not 0 <= size <= MAX_MEMORY_BYTES:  # also refuses nan and inf
        raise ValueError(f"{name}: must be a size from 0 to 1PiB, got {value!r}")
    return int(size)


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of a dtype name ('bfloat16', 'fp16', 'torch.float32', ...)."""
    key = str(dtype).lower().removeprefix("torch.")
    if key not in _DTYPE_BYTES:
        raise ValueError(f"dtype: unknown dtype {dtype!r}; expected one of {sorted(_DTYPE_BYTES)}")
    return _DTYPE_BYTES[key]


def resolve_dtype(requested: str, config: Mapping[str, Any], device: str) -> str:
    """The dtype the engine runs a model in on `device` ("cpu" or "cuda"): one of ENGINE_DTYPES.

    An explicit `requested` dtype wins. For "auto": the config's `torch_dtype`
    (or `dtype`, its newer name; a multimodal config's `text_config` first),
    else DEFAULT_DTYPE[device]; on a CPU float16 becomes float32 (slow there).
    The engine, `pagedinfer plan` and the operator all call this, so they size
    the same pool. Raises InvalidModelConfigError for a dtype the engine cannot run.
    """
    if device not in DEVICE_TYPES:
        raise ValueError(f"device: must be one of {DEVICE_TYPES}, got {device!r}")
    if requested != "auto":
        if requested not in ENGINE_DTYPES:
            raise ValueError(f"dtype: must be auto or one of {ENGINE_DTYPES}, got {requested!r}")
        return requested
    field, declared = None, None
    for cfg in (_text_config(config), config):
        field = next((key for key in ("torch_dtype", "dtype") if cfg.get(key) is not None), None)
        if field is not None:
            declared = cfg[field]
            break
    if field is None:
        return DEFAULT_DTYPE[device]
    name = declared.removeprefix("torch.") if isinstance(declared, str) else None
    if name not in ENGINE_DTYPES:
        raise InvalidModelConfigError(field, declared, f"must be one of {', '.join(ENGINE_DTYPES)}")
    return "float32" if device == "cpu" and name == "float16" else name


def _text_config(config: Any) -> Mapping[str, Any]:
    """The dict holding the language model's fields: `text_config` when there is one, else `config`."""
    if not isinstance(config, Mapping):
        raise InvalidModelConfigError("config.json", type(config).__name__, "must hold a JSON object")
    text = config.get("text_config")
    if text is None:
        return config
    if not isinstance(text, Mapping):
        raise InvalidModelConfigError("text_config", text, "must be an object")
    return text


def _config_int(cfg: Mapping[str, Any], field: str, default: int | None = None) -> int:
    """cfg[field] (default when absent or null) as an integer in [1, CONFIG_FIELD_BOUNDS[field]]."""
    value = cfg.get(field)
    if value is None:
        if default is None:
            raise InvalidModelConfigError(field, None, "is required")
        return default
    maximum = CONFIG_FIELD_BOUNDS[field]
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= maximum:
        raise InvalidModelConfigError(field, value, f"must be an integer from 1 to {maximum}")
    return value


def _positive_int(name: str, value: Any, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: must be an integer >= 1, got {value!r}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name}: must be at most {maximum}, got {value!r}")
    return value


@dataclass(frozen=True)
class ModelShape:
    """The facts about a model that KV sizing needs."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    num_parameters: int
    dtype: str = "bfloat16"
    hidden_size: int | None = None  # None: estimated from num_parameters
    max_position_embeddings: int | None = None
    num_attention_heads: int | None = None  # from a config.json; None when given inline (spec.model.architecture)

    def __post_init__(self) -> None:
        bounds = CONFIG_FIELD_BOUNDS
        _positive_int("num_layers", self.num_layers, bounds["num_hidden_layers"])
        _positive_int("num_kv_heads", self.num_kv_heads, bounds["num_key_value_heads"])
        _positive_int("head_dim", self.head_dim, bounds["head_dim"])
        _positive_int("num_parameters", self.num_parameters, bounds["num_parameters"])
        dtype_bytes(self.dtype)
        if self.hidden_size is not None:
            _positive_int("hidden_size", self.hidden_size, bounds["hidden_size"])
        if self.max_position_embeddings is not None:
            _positive_int("max_position_embeddings", self.max_position_embeddings, bounds["max_position_embeddings"])

    @property
    def dtype_bytes(self) -> int:
        return dtype_bytes(self.dtype)

    @property
    def estimated_hidden_size(self) -> int:
        """hidden_size, or sqrt(P / (12 L)) from the usual 12 L h^2 parameter count."""
        if self.hidden_size is not None:
            return self.hidden_size
        return max(1, int(math.sqrt(self.num_parameters / (12 * self.num_layers))))

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any], dtype: str = "auto", device: str = "cuda") -> "ModelShape":
        """Build from a Hugging Face config.json (as parsed), for an engine on `device`.

        Every field read is checked (`_config_int`); InvalidModelConfigError
        names the first bad one. The dtype is `resolve_dtype(dtype, config,
        device)`. The parameter count is computed for a Llama-style decoder
        (attention, gated MLP, norms, embeddings) when the config states none.
        """
        cfg = _text_config(config)
        layers = _config_int(cfg, "num_hidden_layers")
        hidden = _config_int(cfg, "hidden_size")
        heads = _config_int(cfg, "num_attention_heads")
        kv_heads = _config_int(cfg, "num_key_value_heads", heads)
        if cfg.get("head_dim") is None and hidden < heads:
            raise InvalidModelConfigError("num_attention_heads", heads,
                                          f"must be at most hidden_size ({hidden}) when head_dim is not set")
        head_dim = _config_int(cfg, "head_dim", hidden // heads)
        num_parameters = cfg.get("num_parameters")
        if num_parameters is None:
            vocab = _config_int(cfg, "vocab_size", 32000)
            inter = _config_int(cfg, "intermediate_size", 4 * hidden)
            attn = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2
            per_layer = attn + 3 * hidden * inter + 2 * hidden
            embed = vocab * hidden * (1 if cfg.get("tie_word_embeddings", False) else 2)
            num_parameters = layers * per_layer + embed + hidden
        else:
            num_parameters = _config_int(cfg, "num_parameters")
        max_positions = cfg.get("max_position_embeddings")
        return cls(
            num_layers=layers,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            num_parameters=num_parameters,
            dtype=resolve_dtype(dtype, config, device),
            hidden_size=hidden,
            max_position_embeddings=None if max_positions is None else _config_int(cfg, "max_position_embeddings"),
            num_attention_heads=heads,
        )


def kv_bytes_per_token(shape: ModelShape, tensor_parallel_size: int = 1, kv_dtype: str | None = None) -> int:
    """K and V bytes one token occupies on one GPU, over all layers."""
    _positive_int("tensor_parallel_size", tensor_parallel_size)
    if shape.num_kv_heads % tensor_parallel_size:
        raise ValueError(
            f"tensor_parallel_size: {tensor_parallel_size} does not divide num_kv_heads={shape.num_kv_heads}"
        )
    elem = dtype_bytes(kv_dtype) if kv_dtype else shape.dtype_bytes
    return 2 * shape.num_layers * (shape.num_kv_heads // tensor_parallel_size) * shape.head_dim * elem


def kv_bytes_per_block(shape: ModelShape, block_size: int, tensor_parallel_size: int = 1,
                       kv_dtype: str | None = None) -> int:
    """Bytes of one KV block (block_size tokens) on one GPU."""
    check_block_size(block_size)
    return kv_bytes_per_token(shape, tensor_parallel_size, kv_dtype) * block_size


def check_block_size(block_size: int) -> int:
    if isinstance(block_size, bool) or block_size not in VALID_BLOCK_SIZES:
        raise ValueError(f"block_size: must be one of {VALID_BLOCK_SIZES}, got {block_size!r}")
    return block_size


def weight_bytes_per_gpu(shape: ModelShape, tensor_parallel_size: int = 1) -> int:
    """Weight bytes each GPU holds (parameters x dtype bytes / tp, rounded up)."""
    _positive_int("tensor_parallel_size", tensor_parallel_size)
    return -(-shape.num_parameters * shape.dtype_bytes // tensor_parallel_size)


def estimate_activation_reserve_bytes(shape: ModelShape, max_num_batched_tokens: int, device: str = "cuda") -> int:
    """Activation memory to keep free: a fixed overhead (on a GPU only) plus a per-token term.

    per token = ACTIVATION_HIDDEN_MULTIPLE x hidden_size x dtype_bytes; on a
    GPU the engine replaces this estimate with a measured peak. A CPU engine
    has no CUDA context or workspaces: its runtime lives outside its budget.
    """
    _positive_int("max_num_batched_tokens", max_num_batched_tokens)
    if device not in DEVICE_TYPES:
        raise ValueError(f"device: must be one of {DEVICE_TYPES}, got {device!r}")
    per_token = ACTIVATION_HIDDEN_MULTIPLE * shape.estimated_hidden_size * shape.dtype_bytes
    fixed = FIXED_OVERHEAD_BYTES if device == "cuda" else 0
    return fixed + max_num_batched_tokens * per_token


@dataclass(frozen=True)
class SizingInputs:
    """Everything that decides num_gpu_blocks for one engine."""

    shape: ModelShape
    gpu_memory_bytes: int  # per GPU (with MIG, per slice)
    gpu_memory_utilization: float = 0.9
    block_size: int = 16
    tensor_parallel_size: int = 1
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None  # None: the model's max_position_embeddings, if known
    activation_reserve_bytes: int | None = None  # None: estimated
    weight_bytes_per_gpu: int | None = None  # None: num_parameters x dtype bytes / tp
    kv_dtype: str | None = None  # None: the model dtype

    def __post_init__(self) -> None:
        if isinstance(self.gpu_memory_bytes, bool) or not isinstance(self.gpu_memory_bytes, int) \
                or self.gpu_memory_bytes < 1:
            raise ValueError(f"gpu_memory_bytes: must be an integer >= 1, got {self.gpu_memory_bytes!r}")
        if not (isinstance(self.gpu_memory_utilization, (int, float))
                and 0.0 < self.gpu_memory_utilization <= 1.0):
            raise ValueError(
                f"gpu_memory_utilization: must be in (0, 1], got {self.gpu_memory_utilization!r}")
        check_block_size(self.block_size)
        _positive_int("tensor_parallel_size", self.tensor_parallel_size)
        _positive_int("max_num_batched_tokens", self.max_num_batched_tokens)
        if self.max_model_len is not None:
            _positive_int("max_model_len", self.max_model_len)
        for name in ("activation_reserve_bytes", "weight_bytes_per_gpu"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(f"{name}: must be an integer >= 0, got {value!r}")


@dataclass(frozen=True)
class SizingResult:
    """The KV-cache plan for one GPU. All sizes in bytes."""

    gpu_memory_bytes: int
    gpu_memory_utilization: float
    weight_bytes_per_gpu: int
    activation_reserve_bytes: int
    usable_bytes: int  # what is left for KV blocks
    bytes_per_token: int
    bytes_per_block: int
    block_size: int
    num_gpu_blocks: int
    max_tokens: int  # num_gpu_blocks x block_size
    max_model_len: int | None

    @property
    def max_concurrent_full_sequences(self) -> int | None:
        """How many max_model_len sequences fit at once (None when unknown)."""
        if not self.max_model_len:
            return None
        return self.num_gpu_blocks // -(-self.max_model_len // self.block_size)


def _human_bytes(num_bytes: int) -> str:
    """A human-readable size: GiB, MiB, KiB or bytes, whichever reads best."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(num_bytes) >= scale:
            return f"{num_bytes / scale:.2f} {unit}"
    return f"{num_bytes} bytes"


def plan_kv_cache(inputs: SizingInputs) -> SizingResult:
    """Size the KV block pool of one GPU; raise InsufficientMemoryError if it cannot hold one sequence."""
    shape = inputs.shape
    tp = inputs.tensor_parallel_size
    per_token = kv_bytes_per_token(shape, tp, inputs.kv_dtype)
    per_block = per_token * inputs.block_size
    weights = inputs.weight_bytes_per_gpu if inputs.weight_bytes_per_gpu is not None \
        else weight_bytes_per_gpu(shape, tp)
    reserve = inputs.activation_reserve_bytes if inputs.activation_reserve_bytes is not None \
        else estimate_activation_reserve_bytes(shape, inputs.max_num_batched_tokens)
    budget = int(inputs.gpu_memory_bytes * inputs.gpu_memory_utilization)
    usable = budget - weights - reserve
    max_model_len = inputs.max_model_len or shape.max_position_embeddings
    numbers = (
        f"{_human_bytes(inputs.gpu_memory_bytes)} per GPU x gpu_memory_utilization {inputs.gpu_memory_utilization}"
        f" = {_human_bytes(budget)}; weights {_human_bytes(weights)} per GPU (tensor_parallel_size={tp});"
        f" activation reserve {_human_bytes(reserve)} (max_num_batched_tokens={inputs.max_num_batched_tokens})"
    )
    if usable < per_block:
        raise InsufficientMemoryError(
            f"No room for the KV cache: {numbers} leaves {_human_bytes(max(usable, 0))}, less than one"
            f" {per_block}-byte block. Use GPUs with more memory, raise gpu_memory_utilization,"
            f" raise tensor_parallel_size, or lower max_num_batched_tokens."
        )
    num_blocks = usable // per_block
    if max_model_len:
        needed = -(-max_model_len // inputs.block_size)
        if needed > num_blocks:
            raise InsufficientMemoryError(
                f"No room for the KV cache: one max_model_len={max_model_len} sequence needs {needed}"
                f" blocks ({_human_bytes(needed * per_block)}) but only {num_blocks} fit ({numbers}, leaving"
                f" {_human_bytes(usable)}). Lower max_model_len to at most {num_blocks * inputs.block_size},"
                f" raise gpu_memory_utilization, or use more or larger GPUs."
            )
    return SizingResult(
        gpu_memory_bytes=inputs.gpu_memory_bytes,
        gpu_memory_utilization=inputs.gpu_memory_utilization,
        weight_bytes_per_gpu=weights,
        activation_reserve_bytes=reserve,
        usable_bytes=usable,
        bytes_per_token=per_token,
        bytes_per_block=per_block,
        block_size=inputs.block_size,
        num_gpu_blocks=num_blocks,
        max_tokens=num_blocks * inputs.block_size,
        max_model_len=max_model_len,
    )
