"""The KV-cache event stream's schema, shared by the engine's publisher and the router's feed.

`frames` is the message's framing (topic, sequence number, payload), `events` the vocabulary and its
msgpack payload (vLLM's: batches of BlockStored / BlockRemoved / AllBlocksCleared), `heartbeat` the
stream's liveness message, `block_hash` the hash a block is named by, `tokenizer_files` the tokenizer an
engine serves to a router (GET /kv_events/tokenizer).
"""
