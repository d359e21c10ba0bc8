"""Holding requests while capacity appears (scale to zero): the queue, waking asleep engines, the demand signal.

- `queue.py`: the bounded FIFO of requests waiting for a ready engine, each with its deadline;
- `waiting.py`: a request's wait as HTTP sees it (SSE keep-alives for a stream, the 503 and its reason);
- `capacity.py`: the one task that, while requests wait, wakes an asleep engine first, then signals demand;
- `demand.py` / `contract.py`: the annotation the router PATCHes on its own InferenceService (the operator
  scales 0 -> 1 when it changes), and the names the operator shares with it.
"""
