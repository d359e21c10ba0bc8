"""Loading: one rank's transformers model on its device, sharded, in the forward form that runs it.

`LoadedModel` checks the model (RoPE variants packed batches break), loads it with our paged attention
registered, shards it for tensor parallelism, and chooses its forward: our Triton decoder (CUDA,
`--forward`), the CPU's fused layers and packed weights, or the compiled forward (`--compile`). What it
records of the model (layers, this rank's KV heads, head size, vocabulary, weight bytes) is what the KV
pool is sized and shaped by (`model_shape`). `ModelRunner` (`model_runner.py`) adds the pools and the steps.
"""

from __future__ import annotations

import torch

from pagedinfer.contracts.config.engine_config import EngineConfig
from pagedinfer.contracts.model_shape import ModelShape
from pagedinfer.contracts.model_shape import resolve_dtype as resolve_dtype_name
from pagedinfer.engine.attention import register
from pagedinfer.engine.cpu.compiled_forward import CompiledForward
from pagedinfer.engine.cpu.fused_layers import LayerFusionReport, fuse_layers, fuses_causal_lm
from pagedinfer.engine.cpu.fused_projections import FusionReport, fuse_projections
from pagedinfer.engine.cpu.linear import PackingReport, pack_linear_weights
from pagedinfer.engine.distributed import sharding
from pagedinfer.engine.distributed.group import TPGroup
from pagedinfer.engine.gpu_forward.select import choose_decoder
from pagedinfer.engine.hf_config import load_hf_config

_UNSUPPORTED_ROPE = ("dynamic", "longrope")


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device: 'cuda' requested but no CUDA device is available")
    return torch.device(name)


def tp_device(config: EngineConfig, rank: int) -> torch.device:
    """The device of tensor-parallel rank `rank`: cuda:<rank> on CUDA, the CPU otherwise."""
    device = resolve_device(config.device)
    if device.type != "cuda" or config.tensor_parallel_size == 1:
        return device
    if torch.cuda.device_count() < config.tensor_parallel_size:
        raise ValueError(
            f"tensor_parallel_size: {config.tensor_parallel_size} GPUs per replica, but"
            f" {torch.cuda.device_count()} are visible"
        )
    return torch.device("cuda", rank)


def resolve_dtype(name: str, model_config: dict, device: torch.device) -> torch.dtype:
    """`model_shape.resolve_dtype`'s answer (the one `plan` and the operator size with) as a torch dtype."""
    return getattr(torch, resolve_dtype_name(name, model_config, device.type))


def _rope_types(rope: object) -> list[str]:
    """rope_type values of a rope_scaling/rope_parameters entry, flat or nested per layer type."""
    if not isinstance(rope, dict):
        return []
    kind = rope.get("rope_type") or rope.get("type")
    if kind is not None:
        return [str(kind)]
    return [t for value in rope.values() for t in _rope_types(value)]


def check_rope(model_config: dict) -> None:
    """Reject RoPE variants whose factors depend on the longest position in a batch."""
    cfg = model_config.get("text_config") or model_config
    for key in ("rope_scaling", "rope_parameters"):
        for kind in _rope_types(cfg.get(key)):
            if kind not in _UNSUPPORTED_ROPE:
                continue
            raise ValueError(
                f"model: rope type {kind!r} picks its scaling from the longest sequence in a batch, which"
                " packed batches break; use a model with default/linear/llama3/yarn RoPE"
            )


class LoadedModel:
    """One rank's model as loaded (`group`: its tensor-parallel group, None without tensor parallelism).

    Invariant: every layer routes attention through our paged implementation (checked here, and after each
    transformers forward by the runner)."""

    def __init__(self, config: EngineConfig, group: TPGroup | None = None) -> None:
        import transformers

        self.config = config
        self.group = group
        self.device = tp_device(config, group.rank if group else 0)
        self.hf_config_dict = load_hf_config(config.model)
        check_rope(self.hf_config_dict)
        self.dtype = resolve_dtype(config.dtype, self.hf_config_dict, self.device)
        attn_name = register()
        try:
            self.model = transformers.AutoModelForCausalLM.from_pretrained(
                config.model, dtype=self.dtype, attn_implementation=attn_name
            )
        except (OSError, ValueError, TypeError, KeyError, RuntimeError) as exc:
            raise ValueError(
                f"model: cannot load {config.model!r} with transformers: {type(exc).__name__}: {exc}"
            ) from None
        except Exception as exc:  # e.g. safetensors' or huggingface_hub's own error types
            raise ValueError(f"model: cannot load {config.model!r}: {type(exc).__name__}: {exc}") from None
        if group is not None:
            sharding.shard_model(self.model, group)
        self.model.to(self.device).eval()
        # of the layers the model's tensor-parallel plan splits (by its names: before fusing renames them)
        self.sharded_weight_bytes = sharding.planned_parameter_bytes(self.model)
        # our Triton decoder (--forward; engine/gpu_forward/: on CUDA by default for the families it runs), its
        # q/k/v and gate/up fused into one GEMM each
        choice = choose_decoder(
            self.model, config.forward, self.device, config.tensor_parallel_size, self._rope_positions()
        )
        self.triton_decoder = choice.decoder
        cpu_layers = self.device.type == "cpu" and self.triton_decoder is None
        # on CPU, q/k/v and gate/up fused into one GEMM each, then every linear weight packed once for
        # oneDNN (each replacing the originals: weight_bytes counts every weight once)
        self.fusion: FusionReport | None = fuse_projections(self.model) if cpu_layers else choice.fusion
        self.linear_packing: PackingReport | None = pack_linear_weights(self.model) if cpu_layers else None
        # on CPU, norms, RoPE, SiLU-and-multiply and the residual adds as native ops (the decoder's forward replaced)
        self.layer_fusion: LayerFusionReport | None = (
            fuse_layers(self.model, self._rope_positions()) if cpu_layers else None
        )
        # eager steps of a fused causal LM skip transformers' outer forward (same ops: `causal_lm_logits`)
        self.fused_lm = self.layer_fusion is not None and self.layer_fusion.fused and fuses_causal_lm(self.model)
        if self.model.config._attn_implementation != attn_name:
            raise RuntimeError(f"transformers did not set attention implementation {attn_name!r}")
        text_cfg = self.model.config.get_text_config()
        self.num_layers = int(text_cfg.num_hidden_layers)
        tp = config.tensor_parallel_size
        # this rank's KV heads (all of them without tensor parallelism; all of them too where the plan gathers the
        # keys, as Phi-3's does): its pool holds only these
        self.num_kv_heads = sharding.kv_heads_per_rank(
            self.model, int(getattr(text_cfg, "num_key_value_heads", None) or text_cfg.num_attention_heads), tp
        )
        self.head_dim = int(getattr(text_cfg, "head_dim", None) or text_cfg.hidden_size // text_cfg.num_attention_heads)
        self.hidden_size = int(text_cfg.hidden_size)
        self.vocab_size = int(text_cfg.vocab_size)
        self.max_position_embeddings = getattr(text_cfg, "max_position_embeddings", None)
        self.weight_bytes = sum(p.numel() * p.element_size() for p in self.model.parameters()) + sum(
            b.numel() * b.element_size() for b in self.model.buffers()
        )
        # the compiled forward (--compile, on a CPU only: engine/cpu/compiled_forward.py)
        self.compiled: CompiledForward | None = None
        if config.compile:
            if self.device.type != "cpu":
                raise ValueError(f"compile (--compile): the compiled forward runs on a CPU, not {self.device}")
            self.compiled = CompiledForward(self.model, config.max_num_batched_tokens)

    def _rope_positions(self) -> int:
        """How many positions the fused layers' RoPE table covers: the model's and max_model_len's larger."""
        text_cfg = self.model.config.get_text_config()
        return max(int(getattr(text_cfg, "max_position_embeddings", 0) or 0), self.config.max_model_len or 0, 1)

    def model_shape(self) -> ModelShape:
        return ModelShape(
            num_layers=self.num_layers,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            num_parameters=max(1, sum(p.numel() for p in self.model.parameters())),
            dtype=str(self.dtype).removeprefix("torch."),
            hidden_size=self.hidden_size,
            max_position_embeddings=self.max_position_embeddings,
            vocab_size=self.vocab_size,
        )
