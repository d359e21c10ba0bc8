"""HTTP pieces the engine's server and the router share: the read deadlines' flags (`read_timeouts`,
import-light: the operator adds them to the engine's flags) and uvicorn's protocol enforcing the headers'
deadline (`header_timeout`).
"""
