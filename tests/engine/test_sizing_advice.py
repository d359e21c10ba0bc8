"""When nothing fits, the advice fits the numbers: each fix it offers is enough on its own.

Raising gpu_memory_utilization is offered only when a value <= 1 makes room; when the weights alone
exceed the GPU it is not, and the smallest tensor_parallel_size that fits is named instead.
"""

import dataclasses

import pytest

from pagedinfer.contracts import sizing
from pagedinfer.contracts.model_shape import ModelShape

LLAMA3_8B = ModelShape(
    num_layers=32,
    num_kv_heads=8,
    head_dim=128,
    num_parameters=8_030_261_248,
    dtype="bfloat16",
    hidden_size=4096,
    max_position_embeddings=8192,
)
LLAMA3_70B = ModelShape(
    num_layers=80,
    num_kv_heads=8,
    head_dim=128,
    num_parameters=70_553_706_496,
    dtype="bfloat16",
    hidden_size=8192,
    max_position_embeddings=8192,
)
GIB = 2**30


def advice(shape, gpu_gib, **inputs):
    with pytest.raises(sizing.InsufficientMemoryError) as info:
        sizing.plan_kv_cache(sizing.SizingInputs(shape=shape, gpu_memory_bytes=int(gpu_gib * GIB), **inputs))
    return str(info.value)


def fits(shape, gpu_gib, **inputs):
    return sizing.plan_kv_cache(sizing.SizingInputs(shape=shape, gpu_memory_bytes=int(gpu_gib * GIB), **inputs))


def test_weights_larger_than_the_gpu_suggest_the_smallest_tensor_parallel_size_not_utilization():
    message = advice(LLAMA3_70B, 80)  # 131.42 GiB of bf16 weights, an 80 GiB GPU
    assert "weights alone (131.42 GiB per GPU at tensor_parallel_size=1) exceed the GPU's 80.00 GiB" in message
    assert "raise gpu_memory_utilization" not in message
    assert "raise tensor_parallel_size to 2 (the smallest that fits)" in message
    assert "GPUs with more memory" in message and "smaller model" in message
    fits(LLAMA3_70B, 80, tensor_parallel_size=2)


def test_the_suggested_tensor_parallel_size_is_the_smallest_that_fits():
    message = advice(LLAMA3_70B, 22.5)
    assert "raise tensor_parallel_size to 8 (the smallest that fits)" in message
    fits(LLAMA3_70B, 22.5, tensor_parallel_size=8)
    with pytest.raises(sizing.InsufficientMemoryError):
        fits(LLAMA3_70B, 22.5, tensor_parallel_size=4)


def test_when_no_tensor_parallel_size_fits_it_says_so():
    message = advice(LLAMA3_70B, 16)
    assert "No tensor_parallel_size up to 8 fits" in message and "raise tensor_parallel_size" not in message
    assert "raise gpu_memory_utilization" not in message


def test_utilization_is_suggested_with_the_least_value_that_fits():
    message = advice(LLAMA3_8B, 20, gpu_memory_utilization=0.8)
    assert "raise gpu_memory_utilization to 0.87" in message
    fits(LLAMA3_8B, 20, gpu_memory_utilization=0.87)
    with pytest.raises(sizing.InsufficientMemoryError):
        fits(LLAMA3_8B, 20, gpu_memory_utilization=0.86)


def test_utilization_is_not_suggested_when_even_all_of_the_gpu_is_too_little():
    message = advice(LLAMA3_8B, 16)  # 14.96 GiB of weights + 1.25 GiB reserve + 1 GiB for one sequence > 16 GiB
    assert "raise gpu_memory_utilization" not in message and "weights alone" not in message
    assert "raise tensor_parallel_size to 2" in message


def test_a_long_max_model_len_gets_the_same_checked_advice():
    message = advice(LLAMA3_8B, 24, max_model_len=131072)
    assert "Lower max_model_len to at most" in message
    assert "raise gpu_memory_utilization" not in message  # 16 GiB of KV does not fit beside 15 GiB of weights
    tp = int(message.split("raise tensor_parallel_size to ")[1].split()[0])
    fits(LLAMA3_8B, 24, max_model_len=131072, tensor_parallel_size=tp)
    with pytest.raises(sizing.InsufficientMemoryError):
        fits(LLAMA3_8B, 24, max_model_len=131072, tensor_parallel_size=tp // 2)


def test_fewer_batched_tokens_are_suggested_only_when_a_smaller_reserve_is_enough():
    tight = dataclasses.replace(LLAMA3_8B, max_position_embeddings=16)  # one block per sequence
    message = advice(tight, 18, max_num_batched_tokens=8192)
    most = int(message.split("lower max_num_batched_tokens to at most ")[1].split(";")[0])
    fits(tight, 18, max_num_batched_tokens=most)
    with pytest.raises(sizing.InsufficientMemoryError):
        fits(tight, 18, max_num_batched_tokens=most + 64)
