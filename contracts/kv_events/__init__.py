"""The KV-cache event stream's schema, shared by the engine's publisher and the router's feed.

`events` is the vocabulary and its wire encoding (vLLM's: msgpack batches of BlockStored / BlockRemoved
/ AllBlocksCleared), `heartbeat` the stream's liveness message, `tokenizer_files` the tokenizer an engine
serves to a router (GET /kv_events/tokenizer).
"""
