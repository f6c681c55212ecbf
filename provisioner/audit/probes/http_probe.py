"""Runs ON THE AUDITED HOST for an https server (python3 - UNIT HOST PORT; standard library only).

Asks the server for /health and /v1/models with the key spec mode gives in VP_PROBE_KEY (set, even
empty: the spec's), else its own API key (read from the server process as vLLM picks it: its first
--api-key, else its VLLM_API_KEY; never printed), prints where the key came from (`@@key-source WHERE`) and each raw HTTP
answer after a line `@@ <path>`, as http_probe.sh does for plain http. The server's certificate is not
checked: the probe talks to the local server.
"""
import os
import socket
import ssl
import subprocess
import sys


def api_key(unit):
    """(the key, where it came from)."""
    if "VP_PROBE_KEY" in os.environ:
        return os.environ["VP_PROBE_KEY"], "given"
    pid = subprocess.run(["systemctl", "show", "-p", "MainPID", "--value", unit],
                         stdin=subprocess.DEVNULL, capture_output=True, text=True).stdout.strip()
    none = f"none: pid {pid} has no VLLM_API_KEY and no --api-key"
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            argv = [word.decode() for word in cmdline.read().split(b"\0")]
        for index, word in enumerate(argv):  # vLLM: `args.api_key or [envs.VLLM_API_KEY]`
            if word == "--api-key" and index + 1 < len(argv):
                return argv[index + 1], f"the api-key option on the command line of pid {pid}"
            if word.startswith("--api-key="):
                return word.split("=", 1)[1], f"the api-key option on the command line of pid {pid}"
        with open(f"/proc/{pid}/environ", "rb") as environ:
            for entry in environ.read().split(b"\0"):
                if entry.startswith(b"VLLM_API_KEY="):
                    return entry.split(b"=", 1)[1].decode(), f"VLLM_API_KEY of pid {pid}"
    except (OSError, ValueError):
        return "", none
    return "", none


def main():
    unit, host, port = sys.argv[1:4]
    key, source = api_key(unit)
    print(f"@@key-source {source}", flush=True)
    for path in ("/health", "/v1/models"):
        print(f"\n@@ {path}", flush=True)
        request = f"GET {path} HTTP/1.0\r\nHost: {host}\r\nAuthorization: Bearer {key}\r\n\r\n".encode()
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=5) as plain:
                with ssl._create_unverified_context().wrap_socket(plain, server_hostname=host.strip("[]")) as tls:
                    tls.sendall(request)
                    while chunk := tls.recv(65536):
                        sys.stdout.write(chunk.decode(errors="replace"))
        except OSError as error:
            print(f"error: {host}: {error}")  # named as bash names it in http_probe.sh


if __name__ == "__main__":
    main()
