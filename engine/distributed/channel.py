"""Rank 0 -> every rank: one broadcast of a packed message per step (see step_message)."""

from __future__ import annotations

import time

import torch

from pagedinfer.engine.distributed import step_message
from pagedinfer.engine.distributed.group import TPGroup
from pagedinfer.engine.distributed.step_message import Message


class StepChannel:
    """Sends (rank 0) or receives (others) messages over the control group.

    `broadcast_seconds` and `num_broadcasts` add up rank 0's time in the
    broadcasts, for the share of a step they cost.
    """

    def __init__(self, group: TPGroup, capacity_words: int) -> None:
        self.group = group
        self.capacity_words = capacity_words
        self._buffer = torch.zeros(capacity_words, dtype=torch.int64)
        self.broadcast_seconds = 0.0
        self.num_broadcasts = 0

    def send(self, message: Message) -> None:
        start = time.perf_counter()
        words = step_message.pack(message)
        head = min(len(words), self.capacity_words)
        self._buffer[:head] = words[:head]
        self.group.broadcast(self._buffer)
        if len(words) > self.capacity_words:
            self.group.broadcast(words[self.capacity_words :].clone())
            self.num_broadcasts += 1
        self.num_broadcasts += 1
        self.broadcast_seconds += time.perf_counter() - start

    def recv(self) -> Message:
        self.group.broadcast(self._buffer)
        num_words = int(self._buffer[1])
        words = self._buffer[:num_words]
        if num_words > self.capacity_words:
            rest = torch.empty(num_words - self.capacity_words, dtype=torch.int64)
            self.group.broadcast(rest)
            words = torch.cat([self._buffer, rest])
        return step_message.unpack(words)
