"""Run the registered checks on one host: its facts read in ONE SSH round trip, then every check, in process.

Each concern module (provisioner/audit/checks/*.py) may declare `commands(expected) -> {name: shell command}`
(what to read, from the host's expectations) and `read(expected, outputs) -> {fact: value}` (the parsed facts,
attributes of the `facts` its checks get). All the concerns' commands run as one shell script, each one's
output and exit status framed by a marker line; a concern whose reader fails makes its own checks errors.
A concern may also declare `secrets(expected) -> {variable: value}`: values its commands use as shell
variables ("$variable"), read first from the session's standard input (never on a command line or on disk).
"""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from provisioner.audit.registry import Audit, Case, Check, NotApplicable, all_checks, concerns
from provisioner.base.unreachable import LOST, explain

# every concern's facts may need it: the host is a container (no kernel, initramfs or boot loader of its own)
HOST_COMMANDS = {"virt": "systemd-detect-virt --container"}
SHELL_VARIABLE = re.compile(r"[a-z_][a-z0-9_]*")
# the package (Debian, Ubuntu) of each tool the checks read with: an unknown row names it
TOOL_PACKAGES = {"cat": "coreutils", "stat": "coreutils", "uname": "coreutils", "getconf": "libc-bin",
                 "python3": "python3", "modprobe": "kmod", "lsinitramfs": "initramfs-tools", "grep": "grep"}
NOT_FOUND = re.compile(r"([^\s:]+): (?:command )?not found$", re.M)  # bash's and dash's words for exit 127


@dataclass
class Output:
    text: str
    rc: int


@dataclass
class CheckResult:
    host: str
    check: str
    expected: str
    actual: str
    status: str  # passed | failed | n/a | error
    message: str = ""
    id: str = ""
    seconds: float = 0.0  # the check's run (a host's first check also counts the read of its facts)


class HostLost(ConnectionError):
    """The host stopped answering after the audit connected to it."""


class Facts(SimpleNamespace):
    """What a host has: the facts every concern's `read` returned, as attributes."""


# --------------------------------------------------------------------------- reading


def host_commands(expected: dict[str, Any]) -> dict[str, str]:
    """Every command the host's checks need: name → shell command (a name is the same command in every concern)."""
    commands = dict(HOST_COMMANDS)
    for module in concerns():
        for name, command in (module.commands(expected) if hasattr(module, "commands") else {}).items():
            if commands.setdefault(name, command) != command:
                raise ValueError(f"command {name!r} of {module.__name__} is another concern's, with other text")
    return commands


def host_secrets(expected: dict[str, Any]) -> dict[str, str]:
    """Every secret the host's commands use: shell variable → value (one line each: a line of stdin)."""
    found: dict[str, str] = {}
    for module in concerns():
        for name, value in (module.secrets(expected) if hasattr(module, "secrets") else {}).items():
            if not SHELL_VARIABLE.fullmatch(name) or "\n" in value:
                raise ValueError(f"secret {name!r} of {module.__name__}: a shell variable's name, one line of value")
            if found.setdefault(name, value) != value:
                raise ValueError(f"secret {name!r} of {module.__name__} is another concern's, with another value")
    return found


def run_commands(host: Any, commands: dict[str, str], given: dict[str, str] | None = None) -> dict[str, Output]:
    """Run every command in one SSH round trip (`host.run`, a testinfra host); name → its output
    (stdout and stderr) and exit status. `given`: secrets (shell variable → value) the script reads from its
    standard input before any command runs; the commands themselves get no input."""
    marker = f"@@vp-audit-{secrets.token_hex(6)}"
    script = "".join(f"IFS= read -r {name} || true\n" for name in given or {}) + "".join(
        f"echo '{marker} {name}'; ( {command}\n) 2>&1 </dev/null; rc=$?; echo; echo \"{marker} rc $rc\"\n"
        for name, command in commands.items()
    )
    try:
        result = run_with_input(host, script, "".join(f"{value}\n" for value in given.values())) if given \
            else host.run(script)
    except RuntimeError as error:  # testinfra's ssh backend raises on ssh's own failure (exit 255), with the result
        result = error.args[0] if error.args and hasattr(error.args[0], "rc") else None
        if result is None:
            raise
    if result.rc == 255 and marker not in result.stdout:  # ssh itself failed: the host was lost since it connected
        raise HostLost(f"{LOST} {explain(result.stderr)}")
    if result.rc != 0 and marker not in result.stdout:
        raise RuntimeError(f"reading the host failed (exit {result.rc}): {result.stderr.strip()[-500:]}")
    return parse_outputs(result.stdout, marker)


def run_with_input(host: Any, script: str, stdin: str) -> Any:
    """`host.run(script)` with `stdin` on the script's standard input. testinfra runs every command with none: its
    ssh and local backends' own command line (ssh's alias, config, sudo) run here, given `stdin`."""
    backend = host.backend
    command = backend.get_command(script)
    if hasattr(backend, "_build_ssh_command"):  # ssh, safe-ssh
        line, arguments = backend._build_ssh_command(command)
        command = backend.quote(" ".join(line), *arguments)
    elif backend.NAME != "local":
        raise RuntimeError(f"testinfra's {backend.NAME} backend cannot give the audit's secrets on standard input:"
                           " connect with ssh://")
    done = subprocess.run(backend.encode(command), shell=True, input=stdin.encode(), capture_output=True)
    return backend.result(done.returncode, backend.encode(command), done.stdout, done.stderr)


def parse_outputs(stdout: str, marker: str) -> dict[str, Output]:
    pattern = re.compile(rf"^{re.escape(marker)} (\S+)\n(.*?)\n{re.escape(marker)} rc (\d+)$", re.S | re.M)
    return {name: Output(text, int(rc)) for name, text, rc in pattern.findall(stdout)}


def parse_facts(expected: dict[str, Any], outputs: dict[str, Output]) -> Facts:
    """The facts of every concern; `facts.problems`: concern → why its facts could not be read."""
    facts = Facts(container=outputs["virt"].text.strip() if outputs["virt"].rc == 0 else None, problems={})
    for module in concerns():
        if hasattr(module, "read"):
            try:
                vars(facts).update(module.read(expected, outputs))
            except Exception as error:  # one concern's reader: its checks are errors, the others run
                facts.problems[module.__name__.rpartition(".")[2]] = f"its facts could not be read: {described(error)}"
    return facts


def read_facts(host: Any, expected: dict[str, Any]) -> Facts:
    return parse_facts(expected, run_commands(host, host_commands(expected), host_secrets(expected)))


def json_answer(out: Output, kind: type) -> tuple[Any, str | None]:
    """A host-side script's JSON answer of the type `kind`, or (None, its exit status and last line)."""
    try:
        answer = json.loads(out.text) if out.rc == 0 else None
    except ValueError:
        answer = None
    if isinstance(answer, kind):
        return answer, None
    lines = out.text.strip().splitlines()
    return None, f"exit {out.rc}: {lines[-1] if lines else 'no output'}"


def not_installed(out: Output, tool: str) -> str | None:
    """'TOOL (PACKAGE) is not installed' where the shell found no command to run (exit 127): the one its message
    names, else `tool` (the command's own, its message sent to /dev/null); None where every command was found."""
    if out.rc != 127:
        return None
    named = NOT_FOUND.findall(out.text)
    missing = named[-1] if named else tool
    package = TOOL_PACKAGES.get(missing, missing)
    return f"{missing} is not installed" if package == missing else f"{missing} ({package}) is not installed"


def command_problem(out: Output, tool: str) -> str | None:
    """Why a command's answer cannot be read: its tool is not installed, or it failed; None where it succeeded."""
    if out.rc == 0:
        return None
    lines = out.text.strip().splitlines()
    return not_installed(out, tool) or f"{tool} failed (exit {out.rc}: {lines[-1] if lines else 'no output'})"


def shown_properties(out: Output) -> dict[str, str]:
    """`systemctl show --property=…` of one unit → {property: value}."""
    return dict(line.split("=", 1) for line in out.text.splitlines() if "=" in line)


# --------------------------------------------------------------------------- checking


def described(error: BaseException) -> str:
    return str(error) if isinstance(error, (OSError, RuntimeError)) and str(error) else \
        f"{type(error).__name__}: {error}"


def host_cases(host: str, expected: dict[str, Any]) -> list[tuple[Check, Case, str]]:
    """(check, case, id) of every check run on this host, in the order the audit runs and reports them."""
    return [(found, case, f"{found.concern}::{found.name}[{host}-{item_id}]" if found.ids else
             f"{found.concern}::{found.name}[{host}]")
            for found in all_checks() for case, item_id in found.cases(host, expected)]


def run_case(found: Check, case: Case, test_id: str, facts: Facts) -> CheckResult:
    """One check on one host's facts: passed, failed (drift), n/a, or error (it could not run: never raised)."""
    audit, status, message = Audit(), "passed", ""
    started = time.monotonic()
    try:
        problem = facts.problems.get(found.concern)
        if problem:
            raise RuntimeError(problem)
        found.run(case, facts, audit)
    except NotApplicable as reason:
        status, message = "n/a", str(reason)
    except AssertionError as drift:
        status, message = "failed", str(drift)
    except Exception as error:
        status, message = "error", described(error)
    row = audit.row
    return CheckResult(case.host, row.get("check", test_id.partition("::")[2]), row.get("expected", ""),
                       row.get("actual", message if status == "error" else ""), status, message, test_id,
                       round(time.monotonic() - started, 6))


def audit_facts(host: str, expected: dict[str, Any], read: Callable[[], Facts],
                cases: list[tuple[Check, Case, str]] | None = None) -> Iterator[CheckResult]:
    """Read the host's facts, then yield each check's result as it finishes. A host lost while read: one
    error row per check, each saying so (provisioner/audit/runner.py's say_lost makes it the host's reason)."""
    started = time.monotonic()
    cases = host_cases(host, expected) if cases is None else cases
    try:
        facts = read()
    except Exception as error:
        for _, case, test_id in cases:
            yield CheckResult(host, test_id.partition("::")[2], "", described(error), "error", described(error), test_id,
                              0.0)
        return
    waited = time.monotonic() - started
    for found, case, test_id in cases:
        result = run_case(found, case, test_id, facts)
        result.seconds, waited = round(result.seconds + waited, 6), 0.0
        yield result
