"""The host's TCP sockets, read from the kernel's tables (provisioner/audit/sockets.py, with the parser
provisioner/audit/processes.py shares): addresses written as ss writes them, from /proc-shaped text (the
recording of a real H200 host, Ubuntu 24.04 minimal with no iproute2, where `ss -Hltn` had made the audit say
`nothing on port 8000` while the server served there), from this machine's tables compared with ss, and a table
that cannot be read made the rows' error, never taken for no socket."""

from __future__ import annotations

import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from provisioner.audit import processes
from provisioner.audit.checks import discovered, vllm_service
from provisioner.audit.checks.vllm_service import UnitFacts
from provisioner.audit.engine import Facts, Output
from provisioner.audit.sockets import COMMANDS, read_tables
from tests.unit.audit_rows import run_check

# /proc/net/tcp on the H200 while two vLLM servers ran: 8000 on every address, 8001 on the loopback, one connection
# to 8000
HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
PROC_NET_TCP = HEADER + "".join(f"{line} 0000000000000000 100 0 0 10 0\n" for line in (
    "   0: 00000000:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 52211 1",
    "   1: 0100007F:1F41 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 52307 1",
    "   2: 0100007F:1F40 0100007F:B5C2 01 00000000:00000000 00:00000000 00000000     0        0 53001 1",
))
# tcp6 shaped as a little-endian host writes it: [::]:22 and [::1]:8000 listening, an IPv4 client (10.7.88.20) of a
# dual-stack socket on 8000 (its addresses IPv4-mapped), and a socket in TIME_WAIT (06), neither listening nor open
ANY6, LOOPBACK6 = "0" * 32, "0" * 24 + "01000000"
MAPPED_SERVER, MAPPED_CLIENT = "0" * 16 + "FFFF00000A58070A", "0" * 16 + "FFFF00001458070A"


def tcp_row(slot: int, local: str, remote: str, state: str, inode: int) -> str:
    return f"{slot:4}: {local} {remote} {state} 00000000:00000000 00:00000000 00000000     0        0 {inode} 1 0\n"


PROC_NET_TCP6 = HEADER + "".join([tcp_row(0, f"{ANY6}:0016", f"{ANY6}:0000", "0A", 1893),
                                  tcp_row(1, f"{LOOPBACK6}:1F40", f"{ANY6}:0000", "0A", 1901),
                                  tcp_row(2, f"{MAPPED_SERVER}:1F40", f"{MAPPED_CLIENT}:D431", "01", 1950),
                                  tcp_row(3, f"{MAPPED_SERVER}:1F40", f"{MAPPED_CLIENT}:D432", "06", 0)])


def test_the_tcp_tables_give_the_addresses_as_ss_writes_them():
    assert processes.listening_sockets(PROC_NET_TCP) == {52211: "0.0.0.0:8000", 52307: "127.0.0.1:8001"}
    assert processes.tcp_sockets(PROC_NET_TCP, "ESTABLISHED") == [(53001, "127.0.0.1:8000", "127.0.0.1:46530")]
    assert processes.listening_sockets(PROC_NET_TCP6) == {1893: "[::]:22", 1901: "[::1]:8000"}
    assert processes.tcp_sockets(PROC_NET_TCP6, "ESTABLISHED") == [
        (1950, "[::ffff:10.7.88.10]:8000", "[::ffff:10.7.88.20]:54321")]  # IPv4-mapped, as ss writes them


@pytest.mark.skipif(shutil.which("ss") is None, reason="no ss (iproute2) here to compare with")
def test_the_tcp_tables_read_here_say_what_ss_says():
    """Sockets of this test, on every kind of address, read from this machine's tables and by ss: the same words.
    (ss writes a dual-stack [::] socket `*:PORT`, which the tables cannot tell from an IPv6-only one: they say
    `[::]:PORT`, the form a `--host ::` server's listen address has.)"""
    opened = []
    for family, address in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1"),
                            (socket.AF_INET6, "::"), (socket.AF_INET6, "::ffff:127.0.0.1")):
        server = socket.socket(family)
        if address == "::":
            server.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        server.bind((address, 0))
        server.listen()
        opened.append(server)
    mapped = opened[-1].getsockname()[1]
    client = socket.create_connection(("127.0.0.1", mapped))
    accepted, _ = opened[-1].accept()
    try:
        ports = {str(server.getsockname()[1]) for server in opened}
        tables = {name: Output(Path(path).read_text(), 0) for name, path in (("tcp_table", "/proc/net/tcp"),
                                                                             ("tcp6_table", "/proc/net/tcp6"))}
        read = read_tables(tables)
        ss = subprocess.run(["ss", "-Hltn"], capture_output=True, text=True, check=True).stdout.split("\n")
        assert {address for address in read["listening"] if address.rsplit(":", 1)[1] in ports} == {
            line.split()[3] for line in ss if line and line.split()[3].rsplit(":", 1)[1] in ports}
        ss = subprocess.run(["ss", "-Htn", "state", "established"], capture_output=True, text=True, check=True).stdout
        assert {pair for pair in read["established"] if pair[0].endswith(f":{mapped}")} == {
            tuple(line.split()[2:4]) for line in ss.splitlines() if line.split()[2].endswith(f":{mapped}")}
    finally:
        for each in (client, accepted, *opened):
            each.close()


def test_the_h200s_server_listens_where_its_tables_say_with_no_ss_on_the_host():
    """The H200's row had said `process 1177: listening | 0.0.0.0:8000 | nothing on port 8000 | failed`."""
    tables = {"tcp_table": Output(PROC_NET_TCP, 0), "tcp6_table": Output("", 0)}  # booted with ipv6.disable=1
    facts = Facts(problems={}, **read_tables(tables))
    assert facts.sockets_problem is None and facts.listening == {"0.0.0.0:8000", "127.0.0.1:8001"}
    assert facts.established == [("127.0.0.1:8000", "127.0.0.1:46530")]
    server = {"name": "process 1177", "listen": "0.0.0.0:8000"}
    assert run_check(discovered.process_listening, server, facts) == (
        "passed", {"check": "process 1177: listening", "expected": "0.0.0.0:8000", "actual": "0.0.0.0:8000"})


def test_a_tcp_table_not_read_is_said_never_taken_for_no_socket():
    """A table that cannot be read makes the rows that need it errors naming it."""
    tables = {"tcp_table": Output(PROC_NET_TCP, 0), "tcp6_table": Output(PROC_NET_TCP6, 0)}
    assert read_tables(tables)["listening"] == {"0.0.0.0:8000", "127.0.0.1:8001", "[::]:22", "[::1]:8000"}
    unit = {"name": "vllm-chat.service", "listen": "0.0.0.0:8000"}
    facts = Facts(problems={}, units={unit["name"]: UnitFacts({"LoadState": "loaded"}, {}, None, None, {})},
                  **read_tables(tables))
    assert run_check(vllm_service.listening, unit, facts) == (
        "passed", {"check": "vllm-chat.service: listening", "expected": "0.0.0.0:8000",
                   "actual": "0.0.0.0:8000, [::1]:8000"})
    group = {"name": "vllm-chat.service", "group": {"rank": 1, "size": 2, "master_addr": "10.7.88.20",
                                                     "master_port": 54321, "headless": True}}
    assert run_check(vllm_service.group, group, facts)[1]["actual"] == "connected to [::ffff:10.7.88.20]:54321"

    tables["tcp6_table"] = Output("cat: /proc/net/tcp6: Permission denied\n", 1)
    vars(facts).update(read_tables(tables))
    status, row = run_check(vllm_service.listening, unit, facts)
    assert (status, row["actual"]) == (
        "error", "unknown: /proc/net/tcp6 not read (cat: /proc/net/tcp6: Permission denied)")
    server = {"name": "process 1177", "listen": "0.0.0.0:8000"}
    assert run_check(discovered.process_listening, server, facts)[0] == "error"
    status, row = run_check(vllm_service.group, group, facts)
    assert status == "error" and row["actual"].startswith("unknown: /proc/net/tcp6 not read")


def test_the_tables_are_read_with_cat_and_tcp6_only_where_the_kernel_has_ipv6():
    assert COMMANDS == {"tcp_table": "cat /proc/net/tcp",
                        "tcp6_table": "[ ! -d /proc/sys/net/ipv6 ] || cat /proc/net/tcp6"}
    assert set(COMMANDS) <= set(vllm_service.commands({"units": []}))
