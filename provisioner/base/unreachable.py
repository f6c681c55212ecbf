"""Why a host could not be reached, or was lost mid-run, in network terms.

ssh, Ansible's ssh plugin and Mitogen each word a failed connection their own way (Mitogen's is "was
disconnected from the remote environment … please file a bug"; a refused key reads "SSH password was
requested"). `explain` turns any of them into one sentence a user can act on: no answer for N s,
connection refused, no route, authentication refused, host key refused, the connection closed.
(`HostShell.answers` in provisioner/fleet/remote.py connects once more after a run that lost a host.)

How long a host may stay silent is decided here too, for every path: ssh asks every KEEPALIVE_INTERVAL_S
seconds and gives up after KEEPALIVE_COUNT questions unanswered, so a host that stops answering (link
down, power cut, a firewall dropping its packets) is lost LOST_AFTER_S seconds later: the audit's and
remote commands' ssh (provisioner/fleet/remote.py), Ansible's ssh plugin (the inventory's
ansible_ssh_common_args) and Mitogen's (the inventory's mitogen_ssh_keepalive_*: Mitogen writes its own
keepalive options before any ssh_args, and ssh keeps an option's first value).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

CONNECT_TIMEOUT_S = 10  # ssh's ConnectTimeout (banner exchange included): Ansible's own default `timeout`, so both paths agree
KEEPALIVE_INTERVAL_S = 5
KEEPALIVE_COUNT = 3
LOST_AFTER_S = KEEPALIVE_INTERVAL_S * KEEPALIVE_COUNT
# how the audit says a host was lost after it connected (its facts read; provisioner/audit/runner.py)
LOST = "lost after it connected:"


def liveness_options() -> list[str]:
    """The ssh options that decide when a silent host is given up, as `Keyword value`."""
    return [f"ServerAliveInterval {KEEPALIVE_INTERVAL_S}", f"ServerAliveCountMax {KEEPALIVE_COUNT}"]


@dataclass(frozen=True)
class Cause:
    """One way a connection fails: what ssh, Ansible or Mitogen print for it, and what we say."""

    kind: str
    pattern: re.Pattern
    said: str


CAUSES = (
    Cause("host key", re.compile(r"Host key verification failed|REMOTE HOST IDENTIFICATION HAS CHANGED|"
                                 r"mismatching host key|No \S+ host key is known"),
          "host key refused: the host's key is not the one known_hosts trusts (changed, or never recorded)"),
    Cause("authentication", re.compile(r"Permission denied|SSH password was requested|SSH authentication is "
                                       r"incorrect|Too many authentication failures|Authentication failed"),
          "authentication refused: the host accepted none of the keys offered for this user "
          "(check hosts[].ssh.key and hosts[].ssh.user)"),
    Cause("refused", re.compile(r"Connection refused"),
          "connection refused: nothing listens on the ssh port (sshd stopped, or the host is still booting)"),
    Cause("no route", re.compile(r"No route to host|Network is unreachable|Host is unreachable"),
          "no route to the host (it is down, or the network between us is)"),
    Cause("no name", re.compile(r"Could not resolve hostname|Name or service not known|Temporary failure in name"),
          "its name does not resolve"),
    Cause("no answer", re.compile(r"Connection timed out|timed out during banner exchange|Operation timed out"),
          f"no answer on the ssh port within {CONNECT_TIMEOUT_S} s (down, or a firewall drops the packets)"),
    Cause("silent", re.compile(r"Timeout, server \S+ not responding"),
          f"the host stopped answering: no answer for {LOST_AFTER_S} s on the open connection"),
    Cause("closed", re.compile(r"disconnected from the remote environment|respondent Context has disconnected|"
                               r"EOF on stream|Connection closed by|Connection reset|Broken pipe|"
                               r"Shared connection to \S+ closed|Failed to connect to the host via ssh"),
          f"the connection closed while a task ran (the host stopped answering for {LOST_AFTER_S} s, went down, "
          "or dropped the connection)"),
)
# ssh's own line about it, wherever it is in what was printed
SSH_LINE = re.compile(r"(?:(?:ssh: )+|Timeout, server |Connection (?:closed|reset) by |\S+@\S+: Permission denied)[^\n]*")


def cause_of(raw: str) -> Cause | None:
    return next((cause for cause in CAUSES if cause.pattern.search(raw or "")), None)


def explain(raw: str) -> str:
    """One sentence for a failed connection, with ssh's own line where it printed one; `raw` as it is when
    it is none we know (never a transport's stack or plea)."""
    cause = cause_of(raw)
    if cause is None:
        return raw
    line = SSH_LINE.search(raw or "")
    if line is None:
        return cause.said
    return f"{cause.said} — ssh: {re.sub('^(?:ssh: )+', '', line.group(0)).strip()}"

