"""HTTP pieces the engine's server and the router share: OpenAI's error shape and its exception handlers
(`errors`, `legacy_fields`), the API key (`auth`), the body's size and deadline (`body_limit`), the read
deadlines' flags (`read_timeouts`, import-light: the operator adds them to the engine's flags) and uvicorn's
protocol enforcing the headers' deadline (`header_timeout`), a client's disconnect (`disconnect`), SIGTERM
handling (`graceful_exit`) and the warm-up header (`warmup_requests`).
"""
