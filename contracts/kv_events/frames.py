"""The KV-event stream's frames: `[topic, seq, payload]`, seq 8 bytes big-endian signed (vLLM's).

A batch's seq counts up from 0; two negative numbers are not batches: `END_OF_REPLAY_SEQ` ends a replay
answer, `HEARTBEAT_SEQ` marks a heartbeat (`heartbeat.py`). Standard library only: what forwards or counts
frames without decoding their payload (testing/kv_chaos.py) needs no msgpack.
"""

from __future__ import annotations

END_OF_REPLAY_SEQ = -1  # the sequence number that ends a replay answer (vLLM's END_SEQ)
HEARTBEAT_SEQ = -2  # the sequence frame of a heartbeat


def seq_to_bytes(seq: int) -> bytes:
    return seq.to_bytes(8, "big", signed=True)


def seq_from_bytes(frame: bytes) -> int:
    if len(frame) != 8:
        raise ValueError(f"a sequence frame is 8 bytes, got {len(frame)}")
    return int.from_bytes(frame, "big", signed=True)
