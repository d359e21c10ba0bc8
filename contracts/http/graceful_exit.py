"""SIGTERM ends a uvicorn server with status 0 (`serve` and `router` alike).

uvicorn catches SIGTERM, shuts down gracefully, then re-raises the signal it
caught so the previous handler runs. With the default handler that kills the
process: status 143 (-15 to a parent), which a kubelet reports as an error
exit. A no-op handler installed before uvicorn starts makes the re-raise
harmless, so a graceful shutdown returns normally and exits 0. `exit_now`
ends a process whose shutdown began during the model load. Imports
nothing heavy: the router (no torch) uses it too.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading


def exit_zero_after_sigterm() -> None:
    """Install a no-op SIGTERM handler (main thread only: signal handlers cannot be set elsewhere)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda signum, frame: None)


def absorb_reraised_signals() -> None:
    """No-op handlers for SIGTERM and SIGINT (main thread only), so uvicorn's re-raise ends nothing.

    `serve` then chooses its exit status itself (`launcher.exit_status`)
    instead of SIGINT's KeyboardInterrupt choosing it on the way out.
    """
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, frame: None)


def exit_now(status: int) -> None:
    """Flush the logs and standard streams, then end the process at once with `status`.

    For a shutdown that began while the model was loading: the load runs on
    a thread nobody can interrupt, and an ordinary exit would wait on it or
    tear the interpreter down under it. Nothing else is left to finish then:
    uvicorn and the app's lifespan have already stopped.
    """
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(status)
