"""TEST DOUBLE of a vLLM replica behind the gateway: just enough HTTP for HAProxy's health check and a
slow request. `POST /v1/completions` answers STATUS (200, or e.g. 503 for a replica that is not ready)
after the body's "sleep" seconds (0 for the health check's body); anything else answers 404.

    python3 tests/doubles/completions_replica.py PORT [STATUS]      (listens on 127.0.0.1 only)
"""

from __future__ import annotations

import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Replica(BaseHTTPRequestHandler):
    status = 200
    protocol_version = "HTTP/1.1"

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if self.path != "/v1/completions":
            return self.answer(404, {"error": "not found"})
        time.sleep(float(body.get("sleep", 0)))
        self.answer(self.status, {"object": "text_completion", "choices": [{"text": "pong"}]})

    def answer(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:  # quiet: the tests read HAProxy's view, not this log
        pass


class Server(ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:  # a client (HAProxy's check) gone early: not news
        pass


if __name__ == "__main__":
    Replica.status = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    Server(("127.0.0.1", int(sys.argv[1])), Replica).serve_forever()
