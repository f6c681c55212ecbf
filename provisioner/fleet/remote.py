"""Reaching a spec host: its SSH connection and the ssh options every command that connects uses
(host keys checked strictly: provisioner/base/hostkeys.py), and running commands there — over SSH, or right
here when the host is this machine (a loopback address or localhost on SSH's own port 22: `provision` runs
on the GPU server itself; a loopback address on another port is a forwarded port to another machine).

Commands are shell text run by bash on the host; secrets travel on stdin, never on a command line.
"""

from __future__ import annotations

import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

from provisioner.base.addresses import is_loopback
from provisioner.base.hostkeys import Endpoint, explain_refusal, ssh_options, trust_command
from provisioner.base.unreachable import CONNECT_TIMEOUT_S, explain, liveness_options
from provisioner.spec import Host

SSH_PORT = 22
ANSWERS_AGAIN = "it answers again"  # what HostShell.answers says of a host that answers


@dataclass(frozen=True)
class Connection:
    """How to reach a host over SSH."""

    address: str
    user: str = "root"
    port: int = 22
    key: str | None = None
    known_hosts: str | None = None
    sudo: bool = False


def spec_connection(host: Host) -> Connection:
    ssh = host.ssh
    return Connection(host.address, ssh.user, ssh.port, ssh.key, ssh.known_hosts, ssh.become)


def runs_here(host: Host) -> bool:
    """Whether `host` is this machine: a loopback address on SSH's port (another port on loopback is a
    forwarded port, e.g. to a virtual machine, reached over SSH as Ansible reaches it)."""
    return is_loopback(host.address) and host.ssh.port == SSH_PORT


def connection_options(connection: Connection) -> list[str]:
    options = [
        f"HostName {connection.address}",
        f"User {connection.user}",
        f"Port {connection.port}",
        "BatchMode yes",
        f"ConnectTimeout {CONNECT_TIMEOUT_S}",
        *liveness_options(),
        "LogLevel ERROR",
    ]
    if connection.key:
        options += [f'IdentityFile "{connection.key}"', "IdentitiesOnly yes"]
    return options + ssh_options(connection.known_hosts)  # strict: see provisioner/base/hostkeys.py


class RemoteError(RuntimeError):
    """A command on the host failed; the message has its output."""


@dataclass(frozen=True)
class HostShell:
    """Where a host's commands run: `connection` (SSH) unless `local`."""

    name: str
    connection: Connection
    local: bool = False
    trust_command: str | None = None  # the fix `provision trust SPEC HOST` for a refused host key

    @classmethod
    def for_host(cls, host: Host, spec_path: str | Path | None = None) -> "HostShell":
        return cls(host.name, spec_connection(host), local=runs_here(host),
                   trust_command=trust_command(spec_path, host.name))

    def argv(self, command: str) -> list[str]:
        """The local argv that runs `command` (bash text) on the host, as root when the spec says become."""
        if self.connection.sudo:
            command = f"sudo -n bash -c {shlex.quote(command)}"
        if self.local:
            return ["bash", "-c", command]
        options = [item for option in connection_options(self.connection) for item in ("-o", option)]
        return ["ssh", *options, self.connection.address, "--", command]

    def run(self, command: str, *, stdin: str | None = None, timeout: float | None = None,
            check: bool = True) -> subprocess.CompletedProcess:
        """Run `command`; with check, a non-zero exit raises RemoteError with what it printed."""
        try:
            result = subprocess.run(self.argv(command), input=stdin, capture_output=True, text=True, timeout=timeout,
                                    stdin=None if stdin is not None else subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise RemoteError(f"{self.name}: `{_short(command)}` did not finish within {timeout:.0f} s") from None
        if result.returncode == 255 and not self.local:  # ssh itself failed: a refused host key is explained
            refusal = explain_refusal(result.stderr, Endpoint(self.name, self.connection.address, self.connection.port,
                                                              self.connection.known_hosts, self.trust_command))
            if refusal:
                raise RemoteError(refusal)
            raise RemoteError(f"{self.name}: {explain(result.stderr)}")
        if check and result.returncode != 0:
            output = (result.stderr.strip() or result.stdout.strip())[-2000:]
            raise RemoteError(f"{self.name}: `{_short(command)}` exited {result.returncode}: {output}")
        return result

    def answers(self) -> str:
        """Connect once more (as every command does): what the network says now, or that it answers (a
        host that answers but refuses the command, e.g. sudo wanting a password, answers)."""
        try:
            self.run("true", timeout=CONNECT_TIMEOUT_S + 10, check=False)
        except RemoteError as error:
            return str(error).removeprefix(f"{self.name}: ")
        return ANSWERS_AGAIN

    def read_text(self, path: str) -> str:
        return self.run(f"cat {shlex.quote(path)}").stdout

    def write_text(self, path: str, text: str) -> None:
        """Replace `path` with `text` in one rename, keeping its mode and owner (or 0644 root:root when new)."""
        quoted = shlex.quote(path)
        self.run(f"tmp=$(mktemp {quoted}.XXXXXX) && cat > \"$tmp\" && "
                 f"{{ chmod --reference={quoted} \"$tmp\" 2>/dev/null || chmod 0644 \"$tmp\"; }} && "
                 f"{{ chown --reference={quoted} \"$tmp\" 2>/dev/null || true; }} && mv -f \"$tmp\" {quoted}",
                 stdin=text)


def _short(command: str, limit: int = 120) -> str:
    return command if len(command) <= limit else command[: limit - 1] + "…"
