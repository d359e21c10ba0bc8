"""A model's shape, read once from its config.json, and the dtype it runs in.

Pure, no torch and no I/O. `ModelShape` holds the facts KV sizing needs
(`sizing.py`); the engine, `pagedinfer plan` and the operator build it with
`ModelShape.from_hf_config`, which checks every shape field it uses is an
integer in [1, its bound in CONFIG_FIELD_BOUNDS] and raises
`InvalidModelConfigError` naming the field and its value otherwise (a
multimodal config's `text_config` holds the language model's fields).

The dtype (weights, activations and KV cache alike) is `resolve_dtype`'s
answer for the device the engine runs on; the engine maps it to a torch
dtype, so the three callers size the same pool.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pagedinfer.contracts.validators import positive_int

DEVICE_TYPES = ("cpu", "cuda")
# The dtypes the engine runs a model in (EngineConfig's --dtype choices besides auto).
ENGINE_DTYPES = ("float32", "float16", "bfloat16")
# What dtype auto means when config.json names none: bfloat16 on a GPU (as vLLM and
# every recent checkpoint); float32 on a CPU, where half-precision matmuls are slow.
DEFAULT_DTYPE = {"cuda": "bfloat16", "cpu": "float32"}

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

# The vocabulary sizing assumes when a config.json states none (Llama-2's): the parameter count's
# embeddings and the decode graphs' logits buffers.
DEFAULT_VOCAB_SIZE = 32000

_DTYPE_BYTES = {
    "float32": 4,
    "fp32": 4,
    "float": 4,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "bfloat16": 2,
    "bf16": 2,
    "float8": 1,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
}


class InvalidModelConfigError(ValueError):
    """A config.json that cannot describe a model; `field` and `value` say which entry and what it held."""

    def __init__(self, field: str, value: Any, expected: str) -> None:
        got = "" if value is None else f", got {value!r}"
        super().__init__(f"config.json: {field} {expected}{got}")
        self.field, self.value = field, value


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
    vocab_size: int | None = (
        None  # from a config.json or the loaded model; None: unknown (the graph estimate's default)
    )

    def __post_init__(self) -> None:
        bounds = CONFIG_FIELD_BOUNDS
        positive_int("num_layers", self.num_layers, bounds["num_hidden_layers"])
        positive_int("num_kv_heads", self.num_kv_heads, bounds["num_key_value_heads"])
        positive_int("head_dim", self.head_dim, bounds["head_dim"])
        positive_int("num_parameters", self.num_parameters, bounds["num_parameters"])
        dtype_bytes(self.dtype)
        if self.hidden_size is not None:
            positive_int("hidden_size", self.hidden_size, bounds["hidden_size"])
        if self.max_position_embeddings is not None:
            positive_int("max_position_embeddings", self.max_position_embeddings, bounds["max_position_embeddings"])
        if self.vocab_size is not None:
            positive_int("vocab_size", self.vocab_size, bounds["vocab_size"])

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
    def from_hf_config(cls, config: Mapping[str, Any], dtype: str = "auto", device: str = "cuda") -> ModelShape:
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
            raise InvalidModelConfigError(
                "num_attention_heads", heads, f"must be at most hidden_size ({hidden}) when head_dim is not set"
            )
        head_dim = _config_int(cfg, "head_dim", hidden // heads)
        num_parameters = cfg.get("num_parameters")
        if num_parameters is None:
            vocab = _config_int(cfg, "vocab_size", DEFAULT_VOCAB_SIZE)
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
            vocab_size=_config_int(cfg, "vocab_size", DEFAULT_VOCAB_SIZE),
        )
