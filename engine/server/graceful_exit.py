"""SIGTERM ends a uvicorn server with status 0 (`serve` and `router` alike).

uvicorn catches SIGTERM, shuts down gracefully, then re-raises the signal it
caught so the previous handler runs. With the default handler that kills the
process: status 143 (-15 to a parent), which a kubelet reports as an error
exit. A no-op handler installed before uvicorn starts makes the re-raise
harmless, so a graceful shutdown returns normally and exits 0. Imports
nothing heavy: the router (no torch) uses it too.
"""

from __future__ import annotations

import signal
import threading


def exit_zero_after_sigterm() -> None:
    """Install a no-op SIGTERM handler (main thread only: signal handlers cannot be set elsewhere)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda signum, frame: None)
