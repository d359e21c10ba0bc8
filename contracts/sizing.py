"""KV-cache sizing: how many KV blocks fit on one GPU.

Pure functions, no torch and no I/O: the engine calls them after profiling a
forward pass, the operator calls them from node labels before any pod
exists, and `pagedinfer plan` calls them from a config.json. For the same
inputs all three give the same answer.

The rule (per GPU, tensor parallelism splits weights and KV heads):

    bytes_per_token = 2 (K and V) x num_layers x (num_kv_heads / tp) x head_dim x dtype_bytes
    bytes_per_block = bytes_per_token x block_size
    usable_bytes    = gpu_memory_bytes x gpu_memory_utilization
                      - weight_bytes / tp - activation_reserve_bytes - cuda_graph_bytes
    num_gpu_blocks  = floor(usable_bytes / bytes_per_block)

Known answer: Llama-3-8B (32 layers, 8 KV heads, head_dim 128, bf16) needs
128 KiB per token and 2 MiB per 16-token block.

The activation reserve is measured by the engine's profiling pass when one
ran; otherwise (operator, `plan`) it is estimated by
`estimate_activation_reserve_bytes`, which grows with max_num_batched_tokens.

cuda_graph_bytes is 0 without decode graphs (max_cudagraph_capture_size 0);
with them it is `estimate_cuda_graph_bytes`, in all three callers alike (the
pool is sized before the graphs are captured; a GPU engine then measures
what the capture took and logs it beside this estimate).

When nothing fits, `shortfall_advice` says what would, from the same
arithmetic: each fix it offers (a higher gpu_memory_utilization, the smallest
tensor_parallel_size, fewer batched tokens) is checked to be enough on its own.

The model's side (its shape from a config.json, its dtype) is `model_shape.py`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pagedinfer.contracts.cuda_graph_buckets import capture_sizes
from pagedinfer.contracts.model_shape import (
    DEFAULT_VOCAB_SIZE,
    DEVICE_TYPES,
    ModelShape,
    dtype_bytes,
)
from pagedinfer.contracts.validators import non_negative_int, positive_int

VALID_BLOCK_SIZES = (8, 16, 32, 64, 128)
# No GPU, MIG slice or CPU budget is larger than this (1 PiB): a bigger size is a typo.
MAX_MEMORY_BYTES = 2**50

# Memory the runtime needs whatever the batch: CUDA context, cuBLAS/Triton
# workspaces, allocator fragmentation, the sampler's logits. 1 GiB matches what
# vLLM leaves outside its profiled peak on a single GPU.
FIXED_OVERHEAD_BYTES = 1 << 30
# Peak live activations of one token in a forward pass, in units of
# hidden_size x dtype_bytes (residual, normed input, q/k/v, attention output,
# gate/up/act of the MLP at ~3.5 x hidden each). A deliberate over-estimate.
ACTIVATION_HIDDEN_MULTIPLE = 16

_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "ki": 2**10,
    "kib": 2**10,
    "mi": 2**20,
    "mib": 2**20,
    "gi": 2**30,
    "gib": 2**30,
    "ti": 2**40,
    "tib": 2**40,
}


class InsufficientMemoryError(ValueError):
    """Raised when no KV block, or not one max_model_len sequence, fits."""


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


def kv_bytes_per_token(shape: ModelShape, tensor_parallel_size: int = 1, kv_dtype: str | None = None) -> int:
    """K and V bytes one token occupies on one GPU, over all layers."""
    positive_int("tensor_parallel_size", tensor_parallel_size)
    if shape.num_kv_heads % tensor_parallel_size:
        raise ValueError(
            f"tensor_parallel_size: {tensor_parallel_size} does not divide num_kv_heads={shape.num_kv_heads}"
        )
    elem = dtype_bytes(kv_dtype) if kv_dtype else shape.dtype_bytes
    return 2 * shape.num_layers * (shape.num_kv_heads // tensor_parallel_size) * shape.head_dim * elem


def kv_bytes_per_block(
    shape: ModelShape, block_size: int, tensor_parallel_size: int = 1, kv_dtype: str | None = None
) -> int:
    """Bytes of one KV block (block_size tokens) on one GPU."""
    check_block_size(block_size)
    return kv_bytes_per_token(shape, tensor_parallel_size, kv_dtype) * block_size


def check_block_size(block_size: int) -> int:
    if isinstance(block_size, bool) or block_size not in VALID_BLOCK_SIZES:
        raise ValueError(f"block_size: must be one of {VALID_BLOCK_SIZES}, got {block_size!r}")
    return block_size


def weight_bytes_per_gpu(shape: ModelShape, tensor_parallel_size: int = 1) -> int:
    """Weight bytes each GPU holds (parameters x dtype bytes / tp, rounded up)."""
    positive_int("tensor_parallel_size", tensor_parallel_size)
    return -(-shape.num_parameters * shape.dtype_bytes // tensor_parallel_size)


def estimate_activation_reserve_bytes(shape: ModelShape, max_num_batched_tokens: int, device: str = "cuda") -> int:
    """Activation memory to keep free: a fixed overhead (on a GPU only) plus a per-token term.

    per token = ACTIVATION_HIDDEN_MULTIPLE x hidden_size x dtype_bytes; on a
    GPU the engine replaces this estimate with a measured peak. A CPU engine
    has no CUDA context or workspaces: its runtime lives outside its budget.
    """
    positive_int("max_num_batched_tokens", max_num_batched_tokens)
    if device not in DEVICE_TYPES:
        raise ValueError(f"device: must be one of {DEVICE_TYPES}, got {device!r}")
    fixed = FIXED_OVERHEAD_BYTES if device == "cuda" else 0
    return fixed + max_num_batched_tokens * activation_bytes_per_token(shape)


def activation_bytes_per_token(shape: ModelShape) -> int:
    """The estimate's per-token term: ACTIVATION_HIDDEN_MULTIPLE x hidden_size x dtype_bytes."""
    return ACTIVATION_HIDDEN_MULTIPLE * shape.estimated_hidden_size * shape.dtype_bytes


# Decode graphs (engine/cuda_graphs/). Per row of the largest bucket, the static index buffers: input ids,
# positions, slot mapping, logits index (int64) and sequence length, query start (int32).
GRAPH_INDEX_BYTES_PER_ROW = 4 * 8 + 2 * 4
# What one captured graph holds besides its pool (its kernel nodes and their parameters); to be replaced
# by the figure the first GPU run measures.
GRAPH_OVERHEAD_BYTES = 2 << 20


def estimate_cuda_graph_bytes(
    shape: ModelShape, max_cudagraph_capture_size: int, max_num_seqs: int, max_model_len: int | None, block_size: int
) -> int:
    """Device memory of the decode graphs; 0 when max_cudagraph_capture_size is 0.

    With B the largest bucket (`cuda_graph_buckets.capture_sizes`), W = ceil(max_model_len / block_size) and
    V the vocabulary (DEFAULT_VOCAB_SIZE when unknown):
    - the static buffers: B x (GRAPH_INDEX_BYTES_PER_ROW + 4 W block-table entries + V logits in the dtype);
    - the graphs' shared pool, as large as its largest graph's step: B x (the activation estimate's per-token
      term + V float32 logits), the smaller buckets reusing it;
    - GRAPH_OVERHEAD_BYTES per captured graph.
    """
    sizes = capture_sizes(max_cudagraph_capture_size, max_num_seqs)
    if not sizes:
        return 0
    rows = sizes[-1]
    width = -(-(max_model_len or shape.max_position_embeddings or block_size) // block_size)
    vocab = shape.vocab_size or DEFAULT_VOCAB_SIZE
    static = rows * (GRAPH_INDEX_BYTES_PER_ROW + 4 * width + vocab * shape.dtype_bytes)
    pool = rows * (activation_bytes_per_token(shape) + 4 * vocab)
    return static + pool + len(sizes) * GRAPH_OVERHEAD_BYTES


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
    max_num_seqs: int = 256  # caps the decode graphs' buckets
    max_cudagraph_capture_size: int = 0  # 0: no decode graphs, no graph memory

    def __post_init__(self) -> None:
        positive_int("gpu_memory_bytes", self.gpu_memory_bytes)
        if not (isinstance(self.gpu_memory_utilization, (int, float)) and 0.0 < self.gpu_memory_utilization <= 1.0):
            raise ValueError(f"gpu_memory_utilization: must be in (0, 1], got {self.gpu_memory_utilization!r}")
        check_block_size(self.block_size)
        positive_int("tensor_parallel_size", self.tensor_parallel_size)
        positive_int("max_num_batched_tokens", self.max_num_batched_tokens)
        positive_int("max_num_seqs", self.max_num_seqs)
        non_negative_int("max_cudagraph_capture_size", self.max_cudagraph_capture_size)
        positive_int("max_model_len", self.max_model_len, allow_none=True)
        for name in ("activation_reserve_bytes", "weight_bytes_per_gpu"):
            non_negative_int(name, getattr(self, name), allow_none=True)


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
    cuda_graph_bytes: int = 0  # the decode graphs' estimate (0 without them)

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


# The largest tensor_parallel_size the advice suggests: one node's GPUs (a replica's ranks share one pod).
MAX_SUGGESTED_TENSOR_PARALLEL_SIZE = 8


def _needed_kv_bytes(inputs: SizingInputs, tp: int) -> int:
    """KV bytes one GPU must hold at `tp`: one max_model_len sequence, or one block when the length is unknown."""
    max_model_len = inputs.max_model_len or inputs.shape.max_position_embeddings
    blocks = -(-max_model_len // inputs.block_size) if max_model_len else 1
    return blocks * kv_bytes_per_block(inputs.shape, inputs.block_size, tp, inputs.kv_dtype)


def _weights_at(inputs: SizingInputs, weights: int, tp: int) -> int:
    """Weight bytes per GPU at `tp`, from `weights` at the inputs' own tensor_parallel_size."""
    return -(-weights * inputs.tensor_parallel_size // tp)


def least_fitting_tensor_parallel_size(inputs: SizingInputs, weights: int, reserve: int) -> int | None:
    """The smallest tensor_parallel_size above the inputs' (doubling, dividing num_kv_heads, at most
    MAX_SUGGESTED_TENSOR_PARALLEL_SIZE) at which one sequence fits at the same gpu_memory_utilization;
    None when none does. The activation reserve is per GPU and stays as it is."""
    budget = int(inputs.gpu_memory_bytes * inputs.gpu_memory_utilization)
    tp = inputs.tensor_parallel_size * 2
    while tp <= MAX_SUGGESTED_TENSOR_PARALLEL_SIZE:
        if inputs.shape.num_kv_heads % tp == 0 and budget - _weights_at(
            inputs, weights, tp
        ) - reserve >= _needed_kv_bytes(inputs, tp):
            return tp
        tp *= 2
    return None


def least_fitting_gpu_memory_utilization(inputs: SizingInputs, weights: int, reserve: int) -> float | None:
    """The smallest gpu_memory_utilization (two decimals) at which one sequence fits; None when even 1.0 is
    too little."""
    needed = weights + reserve + _needed_kv_bytes(inputs, inputs.tensor_parallel_size)
    hundredths = -(-needed * 100 // inputs.gpu_memory_bytes)
    while hundredths <= 100 and int(inputs.gpu_memory_bytes * hundredths / 100) < needed:
        hundredths += 1  # the budget is int(memory x utilization): float rounding can cost a byte
    return hundredths / 100 if hundredths <= 100 else None


def shortfall_advice(inputs: SizingInputs, weights: int, reserve: int) -> str:
    """What would make one sequence fit, from the numbers: each fix is offered only when it is enough.

    Raising gpu_memory_utilization is offered only when a value <= 1 fits; tensor parallelism names
    the smallest size that fits (`least_fitting_tensor_parallel_size`); lowering max_num_batched_tokens
    only when the reserve is an estimate and a smaller one fits. When the weights alone exceed the
    GPU, the message says so: then only more ranks, more memory or a smaller model can help."""
    tp = inputs.tensor_parallel_size
    fixes, preface = [], ""
    if weights >= inputs.gpu_memory_bytes:
        preface = (
            f"The weights alone ({_human_bytes(weights)} per GPU at tensor_parallel_size={tp}) exceed the"
            f" GPU's {_human_bytes(inputs.gpu_memory_bytes)}, so no gpu_memory_utilization can help. "
        )
    else:
        utilization = least_fitting_gpu_memory_utilization(inputs, weights, reserve)
        if utilization is not None:
            fixes.append(f"raise gpu_memory_utilization to {utilization:.2f}")
        if inputs.activation_reserve_bytes is None:
            per_token = activation_bytes_per_token(inputs.shape)
            room = (
                int(inputs.gpu_memory_bytes * inputs.gpu_memory_utilization)
                - weights
                - FIXED_OVERHEAD_BYTES
                - _needed_kv_bytes(inputs, tp)
            )
            if room >= per_token:
                fixes.append(f"lower max_num_batched_tokens to at most {room // per_token}")
    more_ranks = least_fitting_tensor_parallel_size(inputs, weights, reserve)
    if more_ranks is not None:
        fixes.append(f"raise tensor_parallel_size to {more_ranks} (the smallest that fits)")
    elif tp < MAX_SUGGESTED_TENSOR_PARALLEL_SIZE:
        preface += f"No tensor_parallel_size up to {MAX_SUGGESTED_TENSOR_PARALLEL_SIZE} fits on these GPUs. "
    fixes.append("use GPUs with more memory")
    fixes.append("serve a smaller model (the engine loads no quantized checkpoints)")
    return preface + "To fit: " + "; or ".join(fixes) + "."


def plan_kv_cache(inputs: SizingInputs) -> SizingResult:
    """Size the KV block pool of one GPU; raise InsufficientMemoryError if it cannot hold one sequence."""
    shape = inputs.shape
    tp = inputs.tensor_parallel_size
    per_token = kv_bytes_per_token(shape, tp, inputs.kv_dtype)
    per_block = per_token * inputs.block_size
    weights = (
        inputs.weight_bytes_per_gpu if inputs.weight_bytes_per_gpu is not None else weight_bytes_per_gpu(shape, tp)
    )
    reserve = (
        inputs.activation_reserve_bytes
        if inputs.activation_reserve_bytes is not None
        else estimate_activation_reserve_bytes(shape, inputs.max_num_batched_tokens)
    )
    budget = int(inputs.gpu_memory_bytes * inputs.gpu_memory_utilization)
    max_model_len = inputs.max_model_len or shape.max_position_embeddings
    graphs = estimate_cuda_graph_bytes(
        shape, inputs.max_cudagraph_capture_size, inputs.max_num_seqs, max_model_len, inputs.block_size
    )
    usable = budget - weights - reserve - graphs
    numbers = (
        f"{_human_bytes(inputs.gpu_memory_bytes)} per GPU x gpu_memory_utilization {inputs.gpu_memory_utilization}"
        f" = {_human_bytes(budget)}; weights {_human_bytes(weights)} per GPU (tensor_parallel_size={tp});"
        f" activation reserve {_human_bytes(reserve)} (max_num_batched_tokens={inputs.max_num_batched_tokens})"
    )
    if graphs:
        numbers += (
            f"; decode graphs {_human_bytes(graphs)} (max_cudagraph_capture_size={inputs.max_cudagraph_capture_size})"
        )
    if usable < per_block:
        raise InsufficientMemoryError(
            f"No room for the KV cache: {numbers} leaves {_human_bytes(max(usable, 0))}, less than one"
            f" {per_block}-byte block. {shortfall_advice(inputs, weights, reserve)}"
        )
    num_blocks = usable // per_block
    if max_model_len:
        needed = -(-max_model_len // inputs.block_size)
        if needed > num_blocks:
            raise InsufficientMemoryError(
                f"No room for the KV cache: one max_model_len={max_model_len} sequence needs {needed}"
                f" blocks ({_human_bytes(needed * per_block)}) but only {num_blocks} fit ({numbers}, leaving"
                f" {_human_bytes(usable)}). Lower max_model_len to at most {num_blocks * inputs.block_size},"
                f" or: {shortfall_advice(inputs, weights, reserve)}"
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
        cuda_graph_bytes=graphs,
    )
