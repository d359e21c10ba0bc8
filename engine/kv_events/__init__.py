"""KV-cache events: the engine tells consumers (a router) which prefix blocks it holds.

`events` is the vocabulary and its wire encoding (vLLM's: msgpack batches of
BlockStored / BlockRemoved / AllBlocksCleared), pure and torch-free, shared
with the router. `publisher` sends them over ZeroMQ without ever blocking the
engine; `routes` adds the discovery and snapshot endpoints to the server.
"""
