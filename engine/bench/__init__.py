"""`pagedinfer bench`: load generators that measure a running server from the client's side.

`serve` (the command `pagedinfer bench serve`) sends timed streamed chat
completions to any OpenAI-compatible server; `workload` is its pure half
(requests, arrival times, statistics). Needs httpx and tqdm (the `engine`
extra), never torch: the load generator runs wherever the server is reachable.
"""
