"""Tensor parallelism: one replica across N processes (one GPU each, or N CPU processes).

Rank 0 is the user's process: it alone owns the scheduler, the block pool,
the prefix cache, sampling and detokenization. Ranks 1..N-1 are child
processes it starts (`workers.py`) and owns: each loads the model, keeps its
shard of the attention and MLP weights as the model's plan says (`sharding.py`,
each style's meaning in `plan_styles.py`: mostly 1/N) and the KV heads its
attention computes (1/N, or all of them where the plan gathers the keys), and runs the same forward as rank 0 on the step inputs rank 0
broadcasts (`step_message.py`) over a gloo group (`group.py`). Inside the
forward, row-parallel layers all-reduce and the LM head gathers its vocab
shards, over gloo on CPU or NCCL on CUDA. Block ids, block tables and slot
mappings are the same on every rank: only the heads differ.
"""

from pagedinfer.engine.distributed.sharding import check_divisible

__all__ = ["check_divisible"]
