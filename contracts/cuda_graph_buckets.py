"""The batch sizes a decode graph is captured for, and the bucket a batch runs at. Pure: no torch.

vLLM's pattern: 1, 2, 4, then multiples of 8 up to 256, then multiples of 16,
up to the largest size; capped by max_num_seqs (no step is larger), and the
cap itself is added when the pattern steps over it, so every batch up to
min(max size, max_num_seqs) has a bucket. A batch of n runs at the smallest
bucket >= n; its rows past n are padding.
"""

from __future__ import annotations

import bisect

from pagedinfer.contracts.validators import non_negative_int, positive_int

SMALL_SIZES = (1, 2, 4)
STEP_TO_256 = 8
STEP_ABOVE_256 = 16


def capture_sizes(max_capture_size: int, max_num_seqs: int) -> tuple[int, ...]:
    """The buckets, ascending; () when max_capture_size is 0 (graphs off)."""
    non_negative_int("max_cudagraph_capture_size", max_capture_size)
    positive_int("max_num_seqs", max_num_seqs)
    largest = min(max_capture_size, max_num_seqs)
    if largest == 0:
        return ()
    pattern = [*SMALL_SIZES, *range(8, 257, STEP_TO_256), *range(256 + STEP_ABOVE_256, largest + 1, STEP_ABOVE_256)]
    sizes = [s for s in pattern if s <= largest]
    if sizes[-1] != largest:
        sizes.append(largest)
    return tuple(sizes)


def bucket_for(num_seqs: int, sizes: tuple[int, ...]) -> int | None:
    """The smallest bucket >= num_seqs, or None when num_seqs is 0 or above the largest (the eager path)."""
    if num_seqs < 1 or not sizes or num_seqs > sizes[-1]:
        return None
    return sizes[bisect.bisect_left(sizes, num_seqs)]
