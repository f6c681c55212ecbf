"""What an instance's unit (checks/vllm_service.py) and its container (checks/vllm_container.py) share: reading
its env file and asking its server (from the host itself), and the checks of its env file and `vllm serve
--config` file: the same files, written by the same role."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

from provisioner.audit.engine import Output
from provisioner.audit.registry import ABSENT, Audit

PROBES = Path(__file__).resolve().parent / "probes"
HTTP_PROBE = PROBES / "http_probe.sh"  # bash /dev/tcp: plain http
HTTPS_PROBE = PROBES / "http_probe.py"  # python's ssl: https
PROBE_TIMEOUT_S = 10


def http_probe_command(name: str, url: str, key: str | None = None) -> str:
    """/health and /v1/models of the server at `url`, from the host itself, asked with the key in the shell
    variable `key` (spec mode: the spec's, read from stdin), else with the server's own (a unit's name: its
    main process's)."""
    scheme, _, address = url.partition("://")
    host, _, port = address.rpartition(":")
    host = shlex.quote(host.strip("[]"))
    probe = f"python3 -c {shlex.quote(HTTPS_PROBE.read_text())}" if scheme == "https" else (
        f"bash -c {shlex.quote(HTTP_PROBE.read_text())} {host}")  # $0: bash's messages name the host, not the unit
    given = f'VP_PROBE_KEY="${key}" ' if key else ""
    return f"{given}timeout {PROBE_TIMEOUT_S} {probe} {name} {host} {shlex.quote(port)}"


def http_answers(text: str) -> dict[str, dict[str, Any]]:
    """The probe's output ('@@ <path>' then the raw HTTP answer, or why there is none), per path:
    {"status": 200, "body": ...} or {"error": "connect: Connection refused"}."""
    answers = {}
    for path, raw in re.findall(r"^@@ (\S+)\n(.*?)(?=^@@ |\Z)", text, re.S | re.M):
        head, _, body = raw.partition("\r\n\r\n")
        status = re.match(r"HTTP/\S+ (\d{3})", head)
        if status:
            answers[path] = {"status": int(status.group(1)), "body": body}
        else:  # why there is none, e.g. "10.88.3.10: connect: Connection refused"
            lines = raw.strip().splitlines()
            answers[path] = {"error": lines[0].removeprefix("error: ") if lines else "no answer within 5 s"}
    return answers


def key_source(text: str) -> dict[str, str]:
    """{"key": where the probe took the API key from} of its `@@key-source WHERE` line ({} without one)."""
    found = re.search(r"^@@key-source (.*)$", text, re.M)
    return {"key": found.group(1).strip()} if found else {}


def env_file_command(path: str) -> str:
    """Its mode, owner and sha256, read by `env_file_stat`."""
    quoted = shlex.quote(path)
    return f"stat -c '%a %U:%G' {quoted} && sha256sum {quoted}"


def env_file_stat(out: Output | None) -> tuple[tuple[str, str] | None, str | None]:
    """((mode, owner:group), sha256) of `stat -c '%a %U:%G' FILE && sha256sum FILE`; (None, None): absent."""
    if out is None or out.rc != 0:
        return None, None
    first, second = out.text.splitlines()[:2]
    mode, owner = first.split()
    return (mode.zfill(4), owner), second.split()[0]


def expect_env_file_mode(audit: Audit, label: str, env_file: dict[str, Any], stat: tuple[str, str] | None) -> None:
    audit.expect(f"{label} mode", env_file["mode"], stat[0] if stat else ABSENT)


def expect_env_file_owner(audit: Audit, label: str, env_file: dict[str, Any], stat: tuple[str, str] | None) -> None:
    audit.expect(f"{label} owner", env_file["owner"], stat[1] if stat else ABSENT)


def expect_env_file_content(audit: Audit, label: str, env_file: dict[str, Any], sha256: str | None) -> None:
    audit.expect(f"{label} content", f"as rendered (sha256 {env_file['sha256'][:12]})",
                 f"sha256 {sha256[:12]}" if sha256 else ABSENT, passed=sha256 == env_file["sha256"])


def expect_config_file(audit: Audit, name: str, config: dict[str, Any], actual: str | None) -> None:
    check = f"{name}: config file {config['path']}"
    expected = f"as rendered ({len(config['content'].splitlines())} lines)"
    if actual is None:
        audit.expect(check, expected, ABSENT, passed=False)
    same = actual == config["content"]
    audit.expect(check, expected, expected if same else first_difference(config["content"], actual), passed=same)


def first_difference(expected: str, actual: str) -> str:
    """Where two texts first differ: "line 7: 'block-size: 32' instead of 'block-size: 16'"."""
    wanted, found = expected.splitlines(), actual.splitlines()
    for number, (line, other) in enumerate(zip(wanted, found), start=1):
        if line != other:
            return f"line {number}: {other!r} instead of {line!r}"
    if len(wanted) != len(found):
        extra = found[len(wanted)] if len(found) > len(wanted) else None
        return (f"line {len(wanted) + 1}: {extra!r} added" if extra is not None
                else f"ends at line {len(found)}; missing {wanted[len(found)]!r}")
    return "differs in line endings or a final newline"
