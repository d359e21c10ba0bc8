"""Output processing beside the forward (issue 16's "Overlap"), as vLLM V1's OutputProcessor.

The engine thread keeps what decides the next step at once: it appends each
sampled token id to its sequence and ends a sequence on the cheap finishes
(EOS, stop_token_ids, grammar, max_tokens, max_model_len), freeing its blocks.
Everything a client reads - detokenization, stop strings with their hold-back,
logprob texts and the deltas - is `text.py`'s work on one `OutputBatch` per
step. With `EngineConfig.overlap` "thread" the batch of step t runs on the
output thread (`thread.py`) while the forward of step t+1 runs; with
"process" in a child process (`process.py`: the same protocol, only what
changed crosses; the child's state is `mirror.py`'s, on which `text.py`'s
functions run), so it truly runs on another core; a stop string found
there ends its sequence from the engine thread right after that forward, and
the token the engine sampled for it meanwhile is dropped, so what a client
sees is the same as without the overlap. Without it the batch runs inline.
"""
