#!/usr/bin/python3
"""TEST DOUBLE — a stand-in for the `vllm` executable, installed by the tests only.

There is no GPU on the test hosts, so real vLLM cannot serve there.  This
stand-in accepts `vllm serve MODEL [--host H] [--port P] [--served-model-name N]
[any other flags]`, then answers like vLLM's OpenAI server does where our tooling
looks: GET /health (200 once "loaded") and GET /v1/models (the served model
name).  GET /standin/process reports its argv and the CUDA environment it was
started with, so tests can see what the systemd unit really passed.
STANDIN_STARTUP_DELAY (seconds) delays the listening socket, like a slow model
load.  Standard library only: the test hosts have no network.
"""
import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def parse(argv):
    if len(argv) < 2 or argv[0] != "serve":
        sys.exit("stand-in vllm: usage: vllm serve MODEL [--host H] [--port P] [...]")
    model, options, i = argv[1], {}, 2
    while i < len(argv):
        flag = argv[i]
        value = argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else None
        options[flag] = value
        i += 2 if value is not None else 1
    return model, options


def main():
    model, options = parse(sys.argv[1:])
    served = options.get("--served-model-name") or model
    host = options.get("--host") or "0.0.0.0"
    port = int(options.get("--port") or 8000)
    process = {
        "argv": sys.argv,
        "env": {k: v for k, v in os.environ.items() if k.startswith(("CUDA_", "VLLM_", "HF_", "STANDIN_"))},
        "user": os.getuid(),
    }
    # never expose the secret itself: report only whether it was set
    if "VLLM_API_KEY" in process["env"]:
        process["env"]["VLLM_API_KEY"] = "<set>"

    class Handler(BaseHTTPRequestHandler):
        def _send(self, code, body):
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/health":
                self._send(200, {})
            elif self.path == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": served, "object": "model", "root": model}]})
            elif self.path == "/standin/process":
                self._send(200, process)
            else:
                self._send(404, {"error": "not found"})

        def log_message(self, *args):
            pass

    print(f"stand-in vllm (TEST DOUBLE) serving {served} on {host}:{port}", flush=True)
    time.sleep(float(os.environ.get("STANDIN_STARTUP_DELAY", "0")))
    ThreadingHTTPServer((host, port), Handler).serve_forever()


if __name__ == "__main__":
    main()
