"""The engine's options, each defined once: `EngineConfig` (`engine_config`), the server's `ServeArgs`
(`serve_args`), the flag machinery the CLI, the operator and the CRD derive from (`options`), argparse
types (`cli_types`) and the host-memory bound `swap_space` is checked against (`host_memory`).
Import-light: the operator imports them (no FastAPI, no msgpack).
"""
