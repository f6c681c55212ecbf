"""The vLLM servers among a host's processes: read on the host itself, sent back as JSON.

Discovery (provisioner/audit/discovery.py) runs this file there as `python3 -c SOURCE` in its one
SSH round trip: standard library only, Python 3.7 or later, nothing written. What it prints:
  {"parents": {PID: PPID} of every process, "comm": {PID: comm}, "servers": [SERVER, ...]}
A SERVER is one vLLM server's process tree, counted once:
  - its main process: one whose command line (/proc/PID/cmdline, NUL-separated: the exact words)
    runs `vllm serve` or `python -m vllm.entrypoints…` (is_vllm_command) and has no such process
    below it; a vLLM command line above it (`timeout 1h vllm serve …`, `sudo -u vllm vllm serve …`)
    is a wrapper of the same server, not a second one; a shell above it (`bash -c "… vllm serve …"`,
    whose own words are `bash`, `-c` and one string) is no vLLM command line at all;
  - its tree: the main process and every process below it (vLLM's `VLLM::EngineCore`, which holds
    the GPU memory, and multiprocessing's resource tracker).
Per server: pid, wrappers, tree, uid and user, the command line (discovery redacts it before
anything shows it), its cgroup (where systemd or a container engine put it), `via` (nohup — SIGHUP
ignored —, a shell, tmux, screen, cron above it), ONLY the variables CUDA_VISIBLE_DEVICES and
CUDA_DEVICE_ORDER of its environment (which may hold secrets: nothing else of it is read) and
whether VLLM_API_KEY is set there (yes or no, never its value), the /dev/shm it sees (its mount
namespace), whether it shares the host's IPC namespace and /dev/shm, and its --config file's text (read
through /proc/PID/root and /proc/PID/cwd: what the process itself reads).

The TCP tables' parser (tcp_sockets: /proc/net/tcp and tcp6, addresses as ss writes them) is the audit's
too: provisioner/audit/sockets.py reads the host's sockets with it.
"""

from __future__ import annotations

import json
import os
import re
import socket
import struct

PROC = "/proc"
WANTED_VARIABLES = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")
SHELLS = ("bash", "sh", "dash", "zsh", "ksh", "fish")
# an ancestor's comm → what it says about how the server was started
LAUNCHERS = {"tmux: server": "tmux", "tmux": "tmux", "SCREEN": "screen", "screen": "screen", "cron": "cron",
             "CRON": "cron", "crond": "cron", "atd": "at"}
# where the walk up stops: what started the session, not part of how the server was started
WALK_STOPS = ("sshd", "systemd", "init", "containerd-shim", "conmon", "runc")
# the TCP states read, as the kernel's TCP tables (/proc/net/tcp, tcp6) write them (include/net/tcp_states.h)
TCP_STATES = {"ESTABLISHED": "01", "LISTEN": "0A"}


def is_vllm_command(argv: list[str]) -> bool:
    """`vllm serve …` (any path to vllm) or `python -m vllm.entrypoints…`."""
    words = [os.path.basename(word) for word in argv]
    serves = any(word == "vllm" and after == "serve" for word, after in zip(words, words[1:]))
    return serves or any(re.match(r"vllm\.entrypoints\b", word) for word in argv)


def command_words(raw: bytes) -> list[str]:
    """/proc/PID/cmdline → its words (a process that rewrote its title leaves trailing empty words)."""
    words = raw.decode("utf-8", "replace").split("\0")
    while words and words[-1] == "":
        words.pop()
    return words


def cgroup_path(text: str) -> str:
    """/proc/PID/cgroup → the unified hierarchy's path (`0::/system.slice/x.service`), or systemd's
    named v1 hierarchy on a hybrid host."""
    lines = [line.split(":", 2) for line in text.splitlines() if line.count(":") >= 2]
    for wanted in ("", "name=systemd"):
        for _, controllers, path in lines:
            if controllers == wanted:
                return path
    return lines[0][2] if lines else ""


def group_servers(processes: dict[int, dict]) -> list[dict]:
    """The servers among `processes` ({pid: {"ppid", "cmdline", ...}}): [{"pid", "wrappers", "tree"}],
    by main pid. Pure: the recording's process list goes through it in the unit tests."""
    children: dict[int, list[int]] = {}
    for pid, process in processes.items():
        children.setdefault(process["ppid"], []).append(pid)
    vllm = {pid for pid, process in processes.items() if is_vllm_command(process["cmdline"])}

    def below(pid: int) -> list[int]:
        found, todo = [], list(children.get(pid, []))
        while todo:
            current = todo.pop()
            found.append(current)
            todo.extend(children.get(current, []))
        return found

    servers = []
    for pid in sorted(vllm):
        tree = below(pid)
        if vllm.intersection(tree):
            continue  # a wrapper: the vLLM command line below it is the server
        wrappers, parent = [], processes[pid]["ppid"]
        while parent in vllm:
            wrappers.append(parent)
            parent = processes[parent]["ppid"]
        servers.append({"pid": pid, "wrappers": wrappers, "tree": sorted([pid, *tree])})
    return servers


def launched_via(server: dict, processes: dict[int, dict]) -> list[str]:
    """How it was started, from what is above it: nohup (SIGHUP ignored by the server or a wrapper), its
    wrappers (`timeout (pid N)`), a shell (`bash -c`), tmux, screen, cron. Only names: never an
    ancestor's command line."""
    chain = [server["pid"], *server["wrappers"]]
    via = ["nohup"] if any(processes[pid].get("sighup_ignored") for pid in chain) else []
    via += [f"{processes[pid]['comm']} (pid {pid})" for pid in server["wrappers"]]
    parent = processes[chain[-1]]["ppid"]
    while parent in processes and parent > 1:
        comm = processes[parent]["comm"]
        if comm.startswith(WALK_STOPS):
            break
        if comm in SHELLS:
            label = f"{comm} -c" if processes[parent].get("dash_c") else comm
            via.append(f"{label} (pid {parent})")
        elif comm in LAUNCHERS:
            via.append(LAUNCHERS[comm])
        parent = processes[parent]["ppid"]
    return list(dict.fromkeys(via))


def tcp_address(hex_address: str) -> str:
    """An address of /proc/net/tcp or tcp6 (`0100007F:1F40`: each 32-bit word as the host stores it, then the
    port) written as ss writes it: `127.0.0.1:8000`, `[::]:8000`, `[::1]:8000`, `[::ffff:10.0.0.5]:8000`
    (glibc's inet_ntop, which ss calls)."""
    address, port = hex_address.split(":")
    raw = b"".join(struct.pack("=I", int(address[index:index + 8], 16)) for index in range(0, len(address), 8))
    if len(raw) == 4:
        return "{}:{}".format(socket.inet_ntop(socket.AF_INET, raw), int(port, 16))
    return "[{}]:{}".format(socket.inet_ntop(socket.AF_INET6, raw), int(port, 16))


def tcp_sockets(text: str, state: str) -> list:
    """/proc/net/tcp or tcp6 → (inode, local address, peer address) of each socket in `state` (LISTEN or
    ESTABLISHED), the addresses as ss writes them (tcp_address)."""
    found = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) > 9 and fields[3] == TCP_STATES[state]:
            found.append((int(fields[9]), tcp_address(fields[1]), tcp_address(fields[2])))
    return found


def listening_sockets(text: str) -> dict:
    """/proc/net/tcp or tcp6 → {socket inode: its address} of the listening sockets."""
    return {inode: local for inode, local, _ in tcp_sockets(text, "LISTEN")}


# --------------------------------------------------------------------------- on the host


def _read(path: str, binary: bool = False):
    try:
        with open(path, "rb" if binary else "r") as handle:
            return handle.read()
    except (OSError, UnicodeDecodeError):
        return None


def read_processes() -> dict[int, dict]:
    processes = {}
    for name in os.listdir(PROC):
        if not name.isdigit():
            continue
        base = f"{PROC}/{name}"
        stat, status = _read(f"{base}/stat"), _read(f"{base}/status")
        if stat is None or status is None:
            continue  # gone meanwhile
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        cmdline = command_words(_read(f"{base}/cmdline", binary=True) or b"")
        processes[int(name)] = {
            "ppid": int(stat.rsplit(")", 1)[1].split()[1]),
            "comm": (_read(f"{base}/comm") or "").strip(),
            "cmdline": cmdline,
            "uid": int(fields.get("Uid", "0").split()[1]),  # effective
            "sighup_ignored": bool(int(fields.get("SigIgn", "0").strip() or "0", 16) & 1),
            "dash_c": "-c" in cmdline[1:2],
        }
    return processes


def environment_facts(pid: int) -> dict:
    """Only CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER, and whether VLLM_API_KEY is set (not its value)."""
    raw = _read(f"{PROC}/{pid}/environ", binary=True)
    if raw is None:
        return {"environment": None, "api_key_in_environment": None}
    wanted, key_set = {}, False
    for entry in raw.split(b"\0"):
        name, _, value = entry.partition(b"=")
        if name.decode("utf-8", "replace") in WANTED_VARIABLES:
            wanted[name.decode()] = value.decode("utf-8", "replace")
        elif name == b"VLLM_API_KEY" and value:
            key_set = True
    return {"environment": wanted, "api_key_in_environment": key_set}


def shm_bytes(pid: int):
    """The size of the /dev/shm the process sees (in its own mount namespace); None: none there."""
    try:
        found = os.statvfs(f"{PROC}/{pid}/root/dev/shm")
    except OSError:
        return None
    return found.f_blocks * found.f_frsize


def shares_host_shm(pid: int):
    """Whether the /dev/shm the process sees is PID 1's (the same filesystem: a private mount namespace
    may still bind the host's, as `docker run --ipc=host` does); None: unreadable."""
    try:
        return os.stat(f"{PROC}/{pid}/root/dev/shm").st_dev == os.stat(f"{PROC}/1/root/dev/shm").st_dev
    except OSError:
        return None


def shares_namespace(pid: int, kind: str):
    """Whether the process is in PID 1's namespace of `kind` (ipc, mnt); None: unreadable."""
    try:
        return os.readlink(f"{PROC}/{pid}/ns/{kind}") == os.readlink(f"{PROC}/1/ns/{kind}")
    except OSError:
        return None


def config_text(pid: int, argv: list[str]):
    """The text of `--config FILE` (or `--config=FILE`) as the process reads it; None: none or unreadable."""
    path = None
    for index, word in enumerate(argv):
        if word == "--config" and index + 1 < len(argv):
            path = argv[index + 1]
        elif word.startswith("--config="):
            path = word.split("=", 1)[1]
    if not path:
        return None
    where = f"{PROC}/{pid}/root{path}" if path.startswith("/") else f"{PROC}/{pid}/cwd/{path}"
    return _read(where)


def user_name(uid: int) -> str:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (KeyError, ImportError):
        return str(uid)


def scan() -> dict:
    processes = read_processes()
    servers = []
    for server in group_servers(processes):
        pid, main = server["pid"], processes[server["pid"]]
        server.update(
            uid=main["uid"], user=user_name(main["uid"]), cmdline=main["cmdline"],
            cgroup=cgroup_path(_read(f"{PROC}/{pid}/cgroup") or ""), via=launched_via(server, processes),
            shm_bytes=shm_bytes(pid), host_ipc=shares_namespace(pid, "ipc"),
            host_shm=shares_host_shm(pid), config=config_text(pid, main["cmdline"]),
            **environment_facts(pid))
        servers.append(server)
    return {
        "parents": {str(pid): process["ppid"] for pid, process in processes.items()},
        "comm": {str(pid): process["comm"] for pid, process in processes.items()},
        "servers": servers,
    }


if __name__ == "__main__":
    print(json.dumps(scan()))
