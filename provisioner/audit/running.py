"""What a vLLM server RUNS against what its files say (issue 35): pure comparisons on the controller.

The process scan (provisioner/audit/processes.py, run on the host) reads, per server, when its main
process started, where its tree listens, the vLLM it imported (the shared objects in its maps and the
dist-info beside them, else its API's /version), how it was started and the times of the files it was
started from. These functions turn that into the rows' words:
  - `restart_pending`: a file (unit, env file, config file, the program or the venv link it runs)
    changed after the process started: what runs is not what the files say;
  - `running_version`: the vLLM version the process imported, and where that was read;
  - `started_by`: how a server was started, in words (systemd unit, user unit of USER, transient unit,
    a crontab line, tmux/screen, nohup/shell, a script, a container);
  - `strays`: on a spec host, every vLLM server and GPU process the spec does not declare.
What the scan could not read is said as such (a verdict of None: unknown), never taken for absence.
Nothing here reads a host or a secret: the data comes in, words go out.
"""

from __future__ import annotations

import time
from typing import Any

NO_RESTART_PENDING = "none: the process started after its files changed"
NO_STRAYS = "(none: only the spec's instances)"
TRANSIENT_UNITS = "/run/systemd/transient/"
STARTERS = ("cron.", "crond.", "anacron.", "atd.", "ssh.", "sshd.")  # units that start a process, not run it


def shown_time(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(epoch))


# a process's start is known to a clock tick (10 ms) on a boot time known to /proc/uptime's 10 ms: a file counts as
# changed after it only beyond that (a unit restarted right after its file was written started after it)
START_PRECISION_S = 0.05


def changed_files(started: float, files: dict[str, float | str | None]) -> list[tuple[str, float]]:
    """(path, mtime) of each file changed after the process started (absent or unread files aside), oldest
    change first."""
    changed = [(path, mtime) for path, mtime in files.items()
               if isinstance(mtime, (int, float)) and mtime > started + START_PRECISION_S]
    return sorted(changed, key=lambda entry: (entry[1], entry[0]))


def restart_pending(pid: int, started: float, files: dict[str, float | str | None]) -> tuple[bool | None, str]:
    """(passed, actual) of `restart pending`: the files changed after process `pid` started, if any. A file's
    time is its mtime, None where it is absent, or why it could not be read (`not read: …`): unless another
    file changed, that leaves the verdict unknown (passed None)."""
    changed = changed_files(started, files)
    if changed:
        listed = ", ".join(f"{path} (changed {shown_time(mtime)})" for path, mtime in changed)
        return False, f"restart pending: {listed}, after pid {pid} started {shown_time(started)}"
    unread = [f"{path} {why}" for path, why in sorted(files.items()) if isinstance(why, str)]
    if unread:
        return None, f"{', '.join(unread)}; pid {pid} started {shown_time(started)}"
    return True, f"none: pid {pid} started {shown_time(started)}, after its files changed"


def running_version(server: dict[str, Any]) -> tuple[str | None, str]:
    """(the vLLM version the process imported, where that was read). Its maps (vLLM's shared objects and the
    dist-info beside them; `(deleted)`: replaced since it started) come first; a process whose maps hold no
    vLLM object (a pure-Python stand-in) is asked its API's /version."""
    imported = server.get("imported") or {}
    deleted = " (deleted)" if imported.get("deleted") else ""
    if imported.get("version"):
        return imported["version"] + deleted, f"mapped from {imported['package']}{deleted}"
    if server.get("api_version"):
        return server["api_version"], "its API's /version"
    if imported.get("problem"):
        return None, f"{imported['problem']}, no /version answer"
    if imported:
        return None, f"mapped from {imported['package']}, no dist-info beside it{deleted}"
    return None, "no vLLM object in its maps, no /version answer"


def cron_words(cron: dict[str, Any] | None) -> str:
    """`root's crontab (@reboot)`; a system crontab: `/etc/cron.d/llm (@reboot, as root)`; plain `cron` unknown."""
    if not cron:
        return "cron"
    if cron["file"].startswith("/var/spool/cron/crontabs/"):
        return f"{cron['user']}'s crontab ({cron['schedule']})"
    return f"{cron['file']} ({cron['schedule']}, as {cron['user']})"


def started_by(server: dict[str, Any], placed: dict[str, str], fragment: str = "") -> str:
    """How a server was started, in words: from where its cgroup places it (`placed`: discovery.supervision),
    the launchers above it (its `via`), the crontab line and the script it runs. `fragment`: the unit's file
    (a transient unit's lies under /run/systemd/transient)."""
    kind, name = placed.get("kind"), placed.get("name", "")
    words = []
    if kind == "unit" and not name.startswith(STARTERS):
        transient = fragment.startswith(TRANSIENT_UNITS) or name.startswith("run-")
        words.append(f"{'transient unit' if transient else 'systemd unit'} {name}")
    elif kind == "user unit":
        words.append(f"user unit {name} of {server.get('user', '?')}")
    elif kind == "container":
        words.append(f"container {name[:12]}")
    via = list(server.get("via", []))
    if "cron" in via or server.get("cron"):
        words.append(cron_words(server.get("cron")))
        via = [word for word in via if word != "cron" and not word.startswith(("sh -c", "bash -c", "dash -c"))]
    words += via
    if server.get("script"):
        words.append(f"a script ({server['script']})")
    if kind in ("session", "scope"):
        words.append(name)
    elif kind == "unit" and not words:
        words.append(f"started by {name}")
    return ", ".join(words) or f"cgroup {placed.get('cgroup') or '(unknown)'}"


def has_api_key(server: dict[str, Any], options: dict[str, Any]) -> bool:
    """Whether the server asks for an API key: --api-key (command line or config file) or VLLM_API_KEY set."""
    return bool(options.get("--api-key") or server.get("api_key_in_environment"))


def listening_words(server: dict[str, Any]) -> str:
    """Where a server's process tree listens: `0.0.0.0:8002`, `no TCP port`, or `ports not read`."""
    if server.get("listening") is None:
        return "ports not read"
    return ", ".join(server["listening"]) or "no TCP port"


def stray_server(server: dict[str, Any], how: str, keyed: bool) -> str:
    """`stray vLLM server: pid 1234 on 0.0.0.0:8002, started by root's crontab (@reboot), no API key`."""
    return (f"stray vLLM server: pid {server['pid']} on {listening_words(server)}, started by {how}, "
            f"{'API key set' if keyed else 'no API key'}")


def declared(server: dict[str, Any], unit_pids: dict[str, int], container_ids: list[str]) -> bool:
    """Whether a running server is one the spec declares: a unit's main process (or in its cgroup), or in a
    declared container's cgroup."""
    cgroup = server.get("cgroup", "")
    if any(pid and pid in server.get("tree", [server["pid"]]) for pid in unit_pids.values()):
        return True
    if any(f"/{name}" in cgroup.split(":")[-1] for name in unit_pids):
        return True
    return any(ident and ident[:12] in cgroup for ident in container_ids)


def stray_gpu_processes(apps: list[dict[str, Any]], parents: dict[str, int], trees: list[list[int]],
                        comm: dict[str, str]) -> list[str]:
    """Each GPU process (nvidia-smi's compute processes: {"pid", "mib", "uuid"}) in none of `trees` (the
    vLLM servers' process trees) nor below them: `stray GPU process: pid 42 (python3) holds 1024 MiB on GPU-…`."""
    members = {pid for tree in trees for pid in tree}
    found = []
    for app in apps:
        pid, seen = app["pid"], set()
        while pid not in members and pid > 1 and pid not in seen:
            seen.add(pid)
            pid = parents.get(str(pid), 0)
        if pid not in members:
            found.append(f"stray GPU process: pid {app['pid']} ({comm.get(str(app['pid']), '?')}) holds"
                         f" {app['mib']} MiB on {app['uuid']}")
    return found


def server_of(scan: dict[str, Any] | None, main_pid: int) -> dict[str, Any] | None:
    """The server of the scan whose main process, wrapper or tree is `main_pid` (a unit's MainPID); None: none."""
    for server in (scan or {}).get("servers", []):
        if main_pid and (main_pid == server["pid"] or main_pid in server.get("wrappers", [])
                         or main_pid in server.get("tree", [])):
            return server
    return None


def unit_restart(server: dict[str, Any] | None, unit_files: list[str], scan: dict[str, Any]) -> tuple[bool | None, str]:
    """(passed, actual) of a spec unit's `UNIT: restart pending`: its unit file, env file and config file (their
    times as the host has them), the program it runs and the venv's `current` link where it runs through it."""
    if server is None:
        return False, "no running server to compare with its files"
    times = scan.get("files", {})
    files = {path: times.get(path) for path in unit_files}
    files.update(server.get("files") or {})
    program = next(iter(path for path in server.get("files") or {} if path.endswith("/bin/vllm")), "")
    for link, mtime in times.items():
        if link.endswith("/current") and program.startswith(link + "/"):
            files[link] = mtime
    return restart_pending(server["pid"], server["started"], files)


def strays(scan: dict[str, Any], unit_pids: dict[str, int], container_ids: list[str], apps: list[dict[str, Any]],
           placed_of, keyed_of) -> list[str]:
    """Every vLLM server of the scan the spec does not declare (stray_server's words) and every GPU process in no
    vLLM server's tree. `placed_of(server)`: where its cgroup places it (discovery.supervision); `keyed_of(server)`:
    whether it asks for an API key."""
    found = [stray_server(server, started_by(server, placed_of(server)), keyed_of(server))
             for server in scan.get("servers", []) if not declared(server, unit_pids, container_ids)]
    trees = [server.get("tree", [server["pid"]]) for server in scan.get("servers", [])]
    return found + stray_gpu_processes(apps, scan.get("parents", {}), trees, scan.get("comm", {}))
