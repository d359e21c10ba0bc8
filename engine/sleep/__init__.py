"""Sleep and wake (scale to zero, as vLLM's sleep mode level 1): release the KV pool and move the weights to
host memory while idle; bring both back on wake.

- `weights.py`: the model's weights to pinned host memory and back, storage by storage (CUDA);
- `sleeper.py`: `EngineSleep`, what sleep and wake do to an `LLMEngine` (on its own thread), and the reports.

The server's routes are `engine/server/sleep_routes.py`.
"""
