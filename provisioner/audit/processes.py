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

What the server runs (issue 35), per server: its start time (epoch seconds, from /proc/PID/stat and the
boot time), the TCP addresses its tree listens on (/proc/net/tcp{,6} and the sockets among its
/proc/PID/fd), the vLLM it imported — the vllm package's shared objects in /proc/PID/maps, the
dist-info beside them (`(deleted)`: a venv replaced under it), else what its API's /version answers —
and, for one cron started, the crontab line (`root's crontab (@reboot)`). A process whose command line is
no vLLM command is a server too when it listens and its maps hold vLLM's shared objects or its port
answers vLLM's API (/version and /v1/models in vLLM's shape): a launcher script, whatever started it.
`python3 -c SOURCE JSON` with {"files": [PATH, ...]} also answers "files": {PATH: mtime, None where absent}
(lstat: a link's own time), what the audit compares with the start times ("restart pending").

What could not be read is said, never taken for absence: "problems" lists the TCP tables not read (then
each server's "listening" is None) and the processes whose program or open files could not be read (a
launcher script among them would go unfound); a file time that cannot be told is `not read: WHY`; a
process's maps not read make its "imported" {"problem": …}.
"""

from __future__ import annotations

import json
import os
import re
import socket
import struct
import time

PROC = "/proc"
WANTED_VARIABLES = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")
SHELLS = ("bash", "sh", "dash", "zsh", "ksh", "fish")
# an ancestor's comm → what it says about how the server was started
LAUNCHERS = {"tmux: server": "tmux", "tmux": "tmux", "SCREEN": "screen", "screen": "screen", "cron": "cron",
             "CRON": "cron", "crond": "cron", "atd": "at"}
# where the walk up stops: what started the session, not part of how the server was started
WALK_STOPS = ("sshd", "systemd", "init", "containerd-shim", "conmon", "runc")


CRONTABS = "/var/spool/cron/crontabs"
SYSTEM_CRONTABS = ("/etc/crontab",)
SYSTEM_CRON_DIR = "/etc/cron.d"
VLLM_OBJECT = re.compile(r"^(?P<package>/\S*?/(?:site|dist)-packages/vllm)/\S+\.so(?:\.\S+)?$")
API_PROBE_TIMEOUT_S = 2
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
    by main pid; a process marked "serves" (found by its maps or its API, not its command line) counts as a
    vLLM command line. Pure: the recording's process list goes through it in the unit tests."""
    children: dict[int, list[int]] = {}
    for pid, process in processes.items():
        children.setdefault(process["ppid"], []).append(pid)
    vllm = {pid for pid, process in processes.items() if process.get("serves") or is_vllm_command(process["cmdline"])}

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


def start_epoch(stat: str, boot_time: float, ticks: int) -> float:
    """/proc/PID/stat → when the process started (epoch seconds): its 22nd field, in clock ticks since boot."""
    return round(boot_time + int(stat.rsplit(")", 1)[1].split()[19]) / ticks, 2)


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


def socket_inodes(links: list[str]) -> set[int]:
    """The targets of /proc/PID/fd's links → the inodes of its sockets (`socket:[12345]`)."""
    return {int(link[8:-1]) for link in links if link.startswith("socket:[") and link.endswith("]")}


def vllm_objects(maps: str) -> dict | None:
    """/proc/PID/maps → the vLLM package whose shared objects the process mapped: {"package": its folder,
    "objects": [file names], "deleted": whether a mapped file was removed or replaced since}; None: none."""
    package, objects, deleted = None, [], False
    for line in maps.splitlines():
        fields = line.split(None, 5)
        path = fields[5].strip() if len(fields) == 6 else ""
        gone = path.endswith(" (deleted)")
        match = VLLM_OBJECT.match(path[:-len(" (deleted)")] if gone else path)
        if match:
            package = package or match.group("package")
            name = match.group(0)[len(match.group("package")) + 1:]
            objects += [name] if name not in objects else []
            deleted = deleted or gone
    return {"package": package, "objects": objects, "deleted": deleted} if package else None


def dist_version(names: list[str]) -> str | None:
    """The names in a site-packages folder → the vllm version its dist-info gives (`vllm-0.11.0.dist-info`)."""
    for name in sorted(names):
        match = re.fullmatch(r"vllm-([^-]+)\.dist-info", name)
        if match:
            return match.group(1)
    return None


def vllm_api_shape(version: dict | None, models: dict | None) -> bool:
    """Whether a port's answers to GET /version and GET /v1/models (no key) are vLLM's: /version's
    {"version": …}, and /v1/models' list of models or the API key's 401 {"error": "Unauthorized"}."""
    if not (version and version.get("status") == 200 and isinstance(version.get("json"), dict)
            and "version" in version["json"]):
        return False
    body = (models or {}).get("json")
    return isinstance(body, dict) and (body.get("object") == "list" or (
        models.get("status") == 401 and body.get("error") == "Unauthorized"))


def runs_argv(command: str, argv: list[str]) -> bool:
    """Whether a crontab command (shell words, up to its first redirection or operator) runs `argv`: what `sh -c`
    exec'd in its place (dash does for a simple last command), an interpreter's script first."""
    import shlex

    try:
        words = shlex.split(command)
    except ValueError:
        return False
    cut = next((index for index, word in enumerate(words) if re.match(r"^(\d?[<>]|[|&;])", word)), len(words))
    words = words[:cut]
    if not words or len(argv) < len(words):
        return False
    programs = {os.path.basename(word) for word in argv[:2]}
    return os.path.basename(words[0]) in programs and argv[len(argv) - len(words) + 1:] == words[1:]


def crontab_entry(crontabs: dict[str, str], command: str | None = None, argv: list[str] | None = None) -> dict | None:
    """The crontab line whose command is `command` (what cron gave `sh -c`) or runs `argv` (the process `sh`
    exec'd): {"user", "schedule", "file"}; crontabs: {path: text}, a user's (/var/spool/cron/crontabs/USER: no
    user field) or the system's (/etc/crontab, /etc/cron.d/*: a user field after the schedule). None: no line."""
    for path, text in sorted(crontabs.items()):
        system = not path.startswith(CRONTABS + "/")
        for line in text.splitlines():
            words = line.strip().split()
            if not words or words[0].startswith("#") or "=" in words[0]:
                continue
            size = (1 if words[0].startswith("@") else 5) + (1 if system else 0)
            fields = line.strip().split(None, size)
            if len(fields) <= size:
                continue
            user = fields[size - 1] if system else path.rsplit("/", 1)[1]
            schedule = " ".join(fields[:size - 1] if system else fields[:size])
            run = fields[size].strip()
            if (command is not None and run == command.strip()) or (argv is not None and runs_argv(run, argv)):
                return {"user": user, "schedule": schedule, "file": path}
    return None


def script_of(argv: list[str]) -> str | None:
    """A server whose command line is no vLLM command: the script its interpreter runs (`python3 launch.py`,
    or the script itself where it was run by its #! line); None: `python3 -c`/`-m` or no script."""
    words = list(argv)
    if words and os.path.basename(words[0]).startswith("python"):
        words = words[1:]
        while words and words[0].startswith("-"):
            if words[0] in ("-c", "-m"):
                return None
            words = words[1:]
    return words[0] if words else None


# --------------------------------------------------------------------------- on the host


def _read(path: str, binary: bool = False):
    try:
        with open(path, "rb" if binary else "r") as handle:
            return handle.read()
    except (OSError, UnicodeDecodeError):
        return None


def boot_time() -> float:
    """When the kernel booted (epoch seconds), to /proc/uptime's hundredth of a second: now less the uptime.
    (/proc/stat's btime is whole seconds, cut short: a process started a moment after a file changed could read
    as started up to a second before it, and the file as changed after it: a false `restart pending`.)"""
    uptime = _read(f"{PROC}/uptime")
    if uptime:
        return time.time() - float(uptime.split()[0])
    for line in (_read(f"{PROC}/stat") or "").splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    return 0.0


def fd_links(pid: int):
    """The targets of the process's open files (/proc/PID/fd's links); None: not readable (not root)."""
    try:
        names = os.listdir(f"{PROC}/{pid}/fd")
    except FileNotFoundError:
        return []  # gone meanwhile
    except OSError:
        return None
    links = []
    for name in names:
        try:
            links.append(os.readlink(f"{PROC}/{pid}/fd/{name}"))
        except OSError:
            pass  # closed meanwhile
    return links


def modified(path: str, stat=os.stat):
    """The file's mtime; None: absent; its problem (`not read: Permission denied`) where it cannot be told."""
    try:
        return stat(path).st_mtime
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as error:
        return f"not read: {error.strerror}"


def read_processes() -> dict[int, dict]:
    processes, booted, ticks = {}, boot_time(), os.sysconf("SC_CLK_TCK")
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
            "started": start_epoch(stat, booted, ticks),
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


def config_path(argv: list[str]):
    """The FILE of `--config FILE` (or `--config=FILE`); None: none."""
    path = None
    for index, word in enumerate(argv):
        if word == "--config" and index + 1 < len(argv):
            path = argv[index + 1]
        elif word.startswith("--config="):
            path = word.split("=", 1)[1]
    return path or None


def seen_by(pid: int, path: str) -> str:
    """`path` as process `pid` sees it: through its root (an absolute path) or its working directory."""
    return f"{PROC}/{pid}/root{path}" if path.startswith("/") else f"{PROC}/{pid}/cwd/{path}"


def config_text(pid: int, argv: list[str]):
    """The text of `--config FILE` (or `--config=FILE`) as the process reads it; None: none or unreadable."""
    path = config_path(argv)
    return _read(seen_by(pid, path)) if path else None


def started_from(pid: int, argv: list[str]) -> dict:
    """{path: modified} of the files the process was started from, as it sees them: its --config file and the
    program its interpreter runs (`bin/vllm`, a launcher script: a venv replaced under it changes it)."""
    return {path: modified(seen_by(pid, path)) for path in (config_path(argv), script_of(argv)) if path}


def listening_by_inode() -> tuple:
    """({socket inode: address} of the host's listening TCP sockets, [each table that could not be read]). A
    kernel without IPv6 (ipv6.disable=1) has no tcp6 table, and no IPv6 socket: nothing is missing there."""
    found, problems = {}, []
    for path in (f"{PROC}/net/tcp", f"{PROC}/net/tcp6"):
        text = _read(path)
        if text is not None:
            found.update(listening_sockets(text))
        elif path.endswith("6") and not os.path.isdir(f"{PROC}/sys/net/ipv6"):
            continue
        else:
            problems.append(f"{path} not read")
    return found, problems


def tree_listening(tree: list[int], listening: dict[int, str]):
    """The addresses the processes of `tree` listen on (TCP); None: a process's open files could not be read."""
    links = [fd_links(pid) for pid in tree]
    if None in links:
        return None
    return sorted({listening[inode] for found in links for inode in socket_inodes(found) if inode in listening})


def http_get(address: str, path: str) -> dict | None:
    """GET `path` of the server at `address` (a listening address: every-interface ones asked on the loopback),
    no key: {"status", "json"}; None: no answer (or not plain http)."""
    import http.client

    host, _, port = address.rpartition(":")
    host = {"0.0.0.0": "127.0.0.1", "[::]": "::1"}.get(host, host.strip("[]"))
    try:
        connection = http.client.HTTPConnection(host, int(port), timeout=API_PROBE_TIMEOUT_S)
        connection.request("GET", path)
        answer = connection.getresponse()
        body = answer.read(65536)
        connection.close()
    except (OSError, ValueError, http.client.HTTPException):
        return None
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    return {"status": answer.status, "json": parsed}


def api_facts(addresses: list[str], port: int | None = None) -> dict:
    """{"address", "version", "vllm_api"} of the first address whose answers are vLLM's API; {} if none is.
    Addresses on `port` (the server's own, from its command line or config) are asked first, and an address
    that does not answer /version is not asked again: a vLLM server also listens on its engine's sockets, which
    take a connection and never answer HTTP (each costs API_PROBE_TIMEOUT_S: on an H100, two servers' 12 such
    sockets made one audit's discovery take 48 s)."""
    for address in sorted(addresses, key=lambda item: item.rpartition(":")[2] != str(port)):
        version = http_get(address, "/version")
        if version is None:
            continue
        models = http_get(address, "/v1/models")
        if vllm_api_shape(version, models):
            return {"address": address, "version": version["json"]["version"], "vllm_api": True}
    return {}


def serving_port(argv: list[str], config: str | None) -> int:
    """The port a `vllm serve` listens on: its command line's --port, else its --config file's `port:`, else
    vLLM's default 8000."""
    for index, word in enumerate(argv):
        value = word.split("=", 1)[1] if word.startswith("--port=") else (
            argv[index + 1] if word == "--port" and index + 1 < len(argv) else None)
        if value is not None and value.isdigit():
            return int(value)
    for line in (config or "").splitlines():  # a YAML file's top-level `port: 8001` (vLLM's --config)
        key, _, value = line.partition(":")
        value = value.split("#")[0].strip().strip("'\"")
        if key == "port" and value.isdigit():
            return int(value)
    return 8000


def imported_vllm(pid: int) -> dict | None:
    """The vLLM the process mapped (vllm_objects) and the version of the dist-info beside it, as the process sees
    its files (/proc/PID/root); None: it maps none; {"problem"}: its maps (or that folder) could not be read."""
    maps = _read(f"{PROC}/{pid}/maps")
    if maps is None:
        return {"problem": f"/proc/{pid}/maps not read"}
    mapped = vllm_objects(maps)
    if mapped is None:
        return None
    site = mapped["package"].rsplit("/", 1)[0]
    try:
        names = os.listdir(f"{PROC}/{pid}/root{site}")
    except OSError as error:
        return {**mapped, "version": None, "problem": f"{site} not read: {error.strerror}"}
    return {**mapped, "version": dist_version(names)}


def crontabs() -> dict[str, str]:
    paths = list(SYSTEM_CRONTABS)
    for folder in (CRONTABS, SYSTEM_CRON_DIR):
        try:
            paths += [f"{folder}/{name}" for name in os.listdir(folder)]
        except OSError:
            pass
    return {path: text for path in paths for text in [_read(path)] if text is not None}


def cron_line(server: dict, processes: dict[int, dict]) -> dict | None:
    """The crontab line that started a server cron runs (its `sh -c` ancestor's command, or the command line
    `sh` exec'd), or None."""
    child, parent = server["pid"], processes[server["pid"]]["ppid"]
    while parent in processes and parent > 1:
        process = processes[parent]
        if LAUNCHERS.get(process["comm"]) == "cron":
            below = processes[child]
            if below.get("dash_c") and len(below["cmdline"]) > 2:
                return crontab_entry(crontabs(), command=below["cmdline"][2])
            return crontab_entry(crontabs(), argv=processes[server["pid"]]["cmdline"])
        child, parent = parent, process["ppid"]
    return None


def mark_api_servers(processes: dict[int, dict], listening: dict[int, str]) -> list[int]:
    """Mark "serves" on each process that serves vLLM's API though its command line is no vLLM command: a python
    that listens, is no vLLM command line's child, and maps vLLM's shared objects or answers as vLLM's API does.
    Returns the pids that could not be told (their program or open files not readable: not root)."""
    commands = {pid for pid, process in processes.items() if is_vllm_command(process["cmdline"])}

    def under_command(pid: int) -> bool:
        seen = set()
        while pid in processes and pid > 1 and pid not in seen:
            seen.add(pid)
            if pid in commands:
                return True
            pid = processes[pid]["ppid"]
        return False

    unread = []
    for pid, process in processes.items():
        if pid in commands or under_command(pid):
            continue
        try:
            python = os.path.basename(os.readlink(f"{PROC}/{pid}/exe")).startswith("python")
        except PermissionError:
            unread.append(pid)
            continue
        except OSError:
            continue  # a kernel thread, or gone meanwhile
        addresses = tree_listening([pid], listening) if python else []
        if addresses is None:
            unread.append(pid)
        if not addresses:
            continue
        mapped = vllm_objects(_read(f"{PROC}/{pid}/maps") or "")
        api = api_facts(addresses)
        if api or mapped:
            process["serves"] = "maps" if mapped else "api"
            process["api"] = api
    return unread


def user_name(uid: int) -> str:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (KeyError, ImportError):
        return str(uid)


def scan(request: dict | None = None) -> dict:
    processes, (listening, unread_tables) = read_processes(), listening_by_inode()
    unread = mark_api_servers(processes, listening)
    problems = unread_tables + ([f"{len(unread)} processes not inspected (pids {', '.join(map(str, unread[:5]))}"
                                 f"{', …' if len(unread) > 5 else ''}): their program or open files not read"]
                                if unread else [])
    servers = []
    for server in group_servers(processes):
        pid, main = server["pid"], processes[server["pid"]]
        addresses = None if unread_tables else tree_listening(server["tree"], listening)
        imported, config = imported_vllm(pid), config_text(pid, main["cmdline"])
        api = main.get("api") or ({} if (imported or {}).get("version") else
                                  api_facts(addresses or [], serving_port(main["cmdline"], config)))
        server.update(
            uid=main["uid"], user=user_name(main["uid"]), cmdline=main["cmdline"],
            cgroup=cgroup_path(_read(f"{PROC}/{pid}/cgroup") or ""), via=launched_via(server, processes),
            shm_bytes=shm_bytes(pid), host_ipc=shares_namespace(pid, "ipc"),
            host_shm=shares_host_shm(pid), config=config,
            started=main["started"], listening=addresses, found_by=main.get("serves") or "command line",
            script=None if is_vllm_command(main["cmdline"]) else script_of(main["cmdline"]),
            imported=imported, api_version=api.get("version"), cron=cron_line(server, processes),
            files=started_from(pid, main["cmdline"]),
            **environment_facts(pid))
        servers.append(server)
    answer = {
        "parents": {str(pid): process["ppid"] for pid, process in processes.items()},
        "comm": {str(pid): process["comm"] for pid, process in processes.items()},
        "servers": servers,
        "problems": problems,
    }
    if request and request.get("files"):
        answer["files"] = {path: modified(path, os.lstat) for path in request["files"]}  # a link's own time
    return answer


if __name__ == "__main__":
    import sys

    print(json.dumps(scan(json.loads(sys.argv[1]) if len(sys.argv) > 1 else None)))
