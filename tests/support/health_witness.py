"""An engine address that only answers GET /health (200, status ok), counting the checks it answers.

Given to a router beside real engines, it witnesses the router's health checks: each engine has its own
supervisor running the same loop, so `checks` growing proves that loop ran, checks that changed nothing
included (all but the first one here), without reading the router's state or waiting a fixed time.
"""

from __future__ import annotations

import http.server
import json
import threading


class HealthWitness:
    def __init__(self, host: str = "127.0.0.1") -> None:
        self.checks = 0
        witness = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                if self.path != "/health":
                    self.send_error(404)
                    return
                witness.checks += 1
                body = json.dumps({"status": "ok"}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer((host, 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self.url = f"http://{host}:{self._server.server_address[1]}"

    def __enter__(self) -> HealthWitness:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)
