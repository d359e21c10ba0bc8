"""The step message survives its broadcast, also when it outgrows the one fixed-size buffer."""

from __future__ import annotations

import threading

import torch

from pagedinfer.engine.batch.deltas import BlockTableUpdate, TableDeltas
from pagedinfer.engine.distributed import step_message
from pagedinfer.engine.distributed.channel import StepChannel
from pagedinfer.engine.distributed.group import TPGroup, connect_store, create_store
from pagedinfer.engine.distributed.step_message import ALLOCATE, STEP, Message, StepInputs

STEP_INPUTS = StepInputs(
    token_ids=[5, 6, 7, 8, 9],
    seq_ids=[31, 40],
    seq_lens=[10, 4],
    query_lens=[1, 4],
    logits_rows=[0, 4],
    table_deltas=TableDeltas((BlockTableUpdate(31, 2, (9,)), BlockTableUpdate(40, 0, (7,))), freed_seq_ids=(12, 3)),
    blocks_to_copy=((1, 2),),
    blocks_to_swap_out=((3, 0), (5, 1)),
    blocks_to_swap_in=((2, 6),),
    tier_stores=((4, 7),),
    tier_loads=((8, 11), (9, 12)),
)


def test_pack_unpack_round_trip_carries_the_table_deltas():
    got = step_message.unpack(step_message.pack(Message(STEP, STEP_INPUTS))).step
    assert got.table_deltas == STEP_INPUTS.table_deltas  # deltas only: seq 31's first two blocks are not resent
    assert (got.token_ids, got.seq_ids, got.seq_lens, got.query_lens, got.logits_rows) == (
        STEP_INPUTS.token_ids,
        STEP_INPUTS.seq_ids,
        STEP_INPUTS.seq_lens,
        STEP_INPUTS.query_lens,
        STEP_INPUTS.logits_rows,
    )
    assert (got.blocks_to_copy, got.blocks_to_swap_out, got.blocks_to_swap_in) == (
        ((1, 2),),
        ((3, 0), (5, 1)),
        ((2, 6),),
    )
    assert (got.tier_stores, got.tier_loads) == (((4, 7),), ((8, 11), (9, 12)))  # every rank runs the tier's copies
    alloc = step_message.unpack(step_message.pack(Message(ALLOCATE, num_gpu_blocks=12, num_cpu_blocks=3)))
    assert (alloc.kind, alloc.num_gpu_blocks, alloc.num_cpu_blocks) == (ALLOCATE, 12, 3)


def test_a_message_larger_than_the_buffer_arrives_whole_over_gloo():
    store = create_store(2)
    received: list = []

    def rank1() -> None:
        group = TPGroup.join(connect_store(store.port, 2), 1, 2, torch.device("cpu"))
        channel = StepChannel(group, capacity_words=16)
        received.extend([channel.recv(), channel.recv()])

    thread = threading.Thread(target=rank1)
    thread.start()
    channel = StepChannel(TPGroup.join(store, 0, 2, torch.device("cpu")), capacity_words=16)
    channel.send(Message(STEP, STEP_INPUTS))  # 41 words: the buffer, then the rest
    channel.send(Message(ALLOCATE, num_gpu_blocks=7))  # fits: one broadcast
    thread.join(60)
    assert received[0].step == step_message.unpack(step_message.pack(Message(STEP, STEP_INPUTS))).step
    assert (received[1].kind, received[1].num_gpu_blocks) == (ALLOCATE, 7)
    assert channel.num_broadcasts == 3
