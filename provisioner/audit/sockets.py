"""The host's TCP sockets, read from the kernel's tables (/proc/net/tcp and tcp6) as `ss` reads them.

No tool is needed on the host but `cat`: iproute2 (ss) is not in every minimal image, and an audit row
must never say "nothing on port 8000" because a tool is missing. The tables are parsed by the process
scan's own parser (provisioner/audit/processes.py's tcp_sockets, which writes addresses as ss does:
`0.0.0.0:8000`, `[::]:8000`, `[::1]:8000`). A table that could not be read makes the rows that need it
errors that say so (`unknown: /proc/net/tcp6 not read (…)`), never a pass nor a claim of absence.
"""

from __future__ import annotations

from typing import Any

from provisioner.audit import processes
from provisioner.audit.engine import Output

# a kernel without IPv6 (ipv6.disable=1) has no tcp6 table, and no IPv6 socket: nothing to read there
COMMANDS = {"tcp_table": "cat /proc/net/tcp", "tcp6_table": "[ ! -d /proc/sys/net/ipv6 ] || cat /proc/net/tcp6"}
TABLES = {"tcp_table": "/proc/net/tcp", "tcp6_table": "/proc/net/tcp6"}


def read_tables(out: dict[str, Output]) -> dict[str, Any]:
    """The facts of the tables: "listening" (the addresses of the listening sockets), "established" ((local,
    peer) of each established connection) and "sockets_problem" (why a table could not be read, or None)."""
    listening, established, unread = set(), [], []
    for name, path in TABLES.items():
        table = out[name]
        if table.rc != 0:
            lines = table.text.strip().splitlines()
            unread.append(f"{path} not read ({lines[-1] if lines else f'exit {table.rc}'})")
            continue
        listening |= {local for _, local, _ in processes.tcp_sockets(table.text, "LISTEN")}
        established += [(local, peer) for _, local, peer in processes.tcp_sockets(table.text, "ESTABLISHED")]
    return {"listening": listening, "established": established, "sockets_problem": "; ".join(unread) or None}


def listening_on(audit: Any, facts: Any, check: str, expected: Any, port: int | str) -> list[str]:
    """The addresses listening on `port`, sorted; the row `check` is unknown where the tables were not read."""
    if facts.sockets_problem:
        audit.unknown(check, expected, facts.sockets_problem)
    return sorted(address for address in facts.listening if address.rsplit(":", 1)[1] == str(port))


def connected(audit: Any, facts: Any, check: str, expected: Any) -> list[tuple[str, str]]:
    """(local, peer) of each established connection; the row `check` is unknown where the tables were not read."""
    if facts.sockets_problem:
        audit.unknown(check, expected, facts.sockets_problem)
    return facts.established
