"""KV-cache events: the engine tells consumers (a router) which prefix blocks it holds.

The schema is a contract (`pagedinfer.contracts.kv_events`: events, heartbeat, tokenizer files), shared
with the router. `publisher` sends them over ZeroMQ without ever blocking the engine; `routes` adds the
discovery and snapshot endpoints to the server.
"""
