"""Async scheduling (`--async-scheduling`, as vLLM v1's): the CPU schedules step N+1 and turns step N-1's
tokens into outputs while step N's forward runs on a second thread.

- `stepper.py`: the step (what runs ahead, placeholders, how a finished sequence's extra token is dropped);
- `forward_thread.py`: the forwards in order on their own thread, and the hand-over of sampled tokens to the
  next forward's input ids on the device;
- `eligibility.py`: the requests that keep the engine synchronous, and why.
"""
