"""Profile mode only: the vLLM servers discovery found on a server we did not build, however they run.

What discovery read (units by name; containers with image, ports, /dev/shm size, command line and
the environment the rules ask about; every vLLM server process, in a unit, a container or bare) is
reported; the profile's rules apply to the containers and the bare processes. Each running server
(SERVER: the unit's name, `container NAME`, or `process PID` for a bare process) gets how it is
supervised, where it binds, its /dev/shm and IPC and the GPUs it holds; a bare process (which no
unit rule covers) also its user, command line, CUDA variables and listening port; each GPU whether
the servers' memory shares on it add up. Spec mode has no discovery: these checks do not run there.
"""

from provisioner.audit.expectations import BIND, NOT_ROOT, SHARES, SUPERVISED
from provisioner.audit.registry import REPORTED, UNSET, each
from provisioner.audit.running import NO_RESTART_PENDING
from provisioner.audit.sockets import listening_on

discovery = each(lambda expected: [expected] if "containers" in expected else [], ids=lambda _: "discovery")
containers = each(lambda expected: expected.get("containers", {}).get("found", []), ids=lambda found: found["name"])


def per_container_rule(key: str):
    return each(
        lambda expected: [
            (container, name, rule)
            for container in expected.get("containers", {}).get("found", [])
            for name, rule in container["rules"][key].items()
        ],
        ids=lambda entry: f"{entry[0]['name']}-{entry[1]}",
    )


@discovery
def units_found(case, audit):
    """`vLLM units` — the systemd units whose ExecStart runs a vLLM server, whatever their name (reported).

    Modes: profile.
    """
    names = [unit["name"] for unit in case.item["units"]]
    audit.expect("vLLM units", REPORTED, names or "none found")


@discovery
def gpus_found(case, audit):
    """`GPUs` — the GPUs nvidia-smi lists, or why none were read (reported).

    Modes: profile.
    """
    found = case.item["gpus_found"]
    audit.expect("GPUs", REPORTED, [f"GPU {index}" for index in found["indexes"]] or f"none found ({found['problem']})")


@discovery
def containers_found(case, audit):
    """`vLLM containers` — the docker/podman containers running a vLLM server, or why none (reported).

    Modes: profile.
    """
    found, tools = case.item["containers"]["found"], case.item["containers"]["tools"]
    if not tools:
        actual = "none found (no docker or podman)"
    else:
        actual = [f"{container['name']} ({container['tool']})" for container in found] or f"none found ({', '.join(tools)})"
    audit.expect("vLLM containers", REPORTED, actual)


@containers
def container_image(case, audit):
    """`container NAME: image` — the image the discovered container runs (reported).

    Modes: profile.
    """
    audit.expect(f"container {case.item['name']}: image", REPORTED, case.item["image"])


@containers
def container_ports(case, audit):
    """`container NAME: ports` — the ports the discovered container publishes (reported).

    Modes: profile.
    """
    audit.expect(f"container {case.item['name']}: ports", REPORTED, case.item["ports"] or "none published")


@containers
def container_shm(case, audit):
    """`container NAME: /dev/shm size` — the container's /dev/shm against at least the profile's `shm_size_min`.

    Modes: profile.
    """
    shm = case.target["shm"]
    check = f"container {case.item['name']}: /dev/shm size"
    if shm["size"] is None:
        audit.not_applicable(check, "(any)", "the profile sets no shm_size_min")
    actual = case.item["shm_bytes"]
    audit.expect(check, f"at least {shm['bytes']} bytes ({shm['size']})", f"{actual} bytes",
                 passed=actual is not None and actual >= shm["bytes"])


@per_container_rule("environment")
def container_environment(case, audit):
    """`container NAME: Environment VAR` — a variable of the container's environment against the profile's rule.

    Modes: profile.
    """
    container, name, rule = case.item
    audit.expect(f"container {container['name']}: Environment {name}", rule, container["environment"].get(name, UNSET))


@containers
def container_command_line(case, audit):
    """`container NAME: command line` — the container's command line (keys redacted) against the profile's rule.

    Modes: profile.
    """
    audit.expect(f"container {case.item['name']}: command line", case.item["rules"]["command_line"],
                 case.item["command_line"])


servers = each(lambda expected: expected.get("servers", []), ids=lambda server: server["name"])


def servers_of(*kinds: str):
    return each(lambda expected: [server for server in expected.get("servers", []) if server["kind"] in kinds],
                ids=lambda server: server["name"])


def per_process_rule(key: str):
    return each(
        lambda expected: [(server, name, rule) for server in expected.get("servers", []) if server["kind"] == "process"
                          for name, rule in server["rules"][key].items()],
        ids=lambda entry: f"{entry[0]['name']}-{entry[1]}",
    )


gpu_cards = each(lambda expected: expected.get("gpu_cards", []), ids=lambda card: f"GPU{card['index']}")


@discovery
def processes_found(case, audit):
    """`vLLM processes` — the vLLM servers running as bare processes (in no unit and no container), with how they were started (reported).

    Modes: profile.
    """
    found = case.item.get("processes", {"problem": None, "bare": []})
    if found["problem"]:
        audit.expect("vLLM processes", "the host's processes read", f"not read: {found['problem']}", passed=False)
    audit.expect("vLLM processes", REPORTED, found["bare"] or "none outside units and containers")


@servers
def server_supervised(case, audit):
    """`SERVER: supervised` — what brings the server back after a crash and a reboot: a unit or a container's restart policy; a bare process fails.

    Modes: profile.
    """
    server = case.item
    audit.expect(f"{server['name']}: supervised", SUPERVISED, server["supervised"]["actual"],
                 passed=server["supervised"]["passed"])


@servers_of("process", "container")
def server_user(case, audit):
    """`process PID: user` or `container NAME: user` — the user the server's process runs as on the host: not root (a unit's User= row covers units).

    Modes: profile.
    """
    server = case.item
    audit.expect(f"{server['name']}: user", NOT_ROOT, server["user"]["actual"], passed=server["user"]["passed"])


@servers
def server_bind_address(case, audit):
    """`SERVER: bind address` — where the server listens (a container: where its ports are published): every interface fails only with no API key.

    Modes: profile.
    """
    server = case.item
    audit.expect(f"{server['name']}: bind address", BIND, server["bind"]["actual"], passed=server["bind"]["passed"])


@servers_of("process")
def process_command_line(case, audit):
    """`process PID: command line` — a bare server's command line as /proc has it (keys redacted) against the profile's rule (no --api-key).

    Modes: profile.
    """
    server = case.item
    audit.expect(f"{server['name']}: command line", server["rules"]["command_line"], server["command_line"])


@per_process_rule("environment")
def process_environment(case, audit):
    """`process PID: Environment VAR` — a CUDA variable of a bare server's environment (/proc/PID/environ; no other variable is read) against the profile's rule.

    Modes: profile.
    """
    server, name, rule = case.item
    audit.expect(f"{server['name']}: Environment {name}", rule, server["environment"].get(name, UNSET))


@servers_of("process")
def process_listening(case, facts, audit):
    """`process PID: listening` — the address a bare server's command line (or --config file) gives, against the host's listening sockets.

    Modes: profile.
    """
    server = case.item
    port = server["listen"].rsplit(":", 1)[1]
    on_port = listening_on(audit, facts, f"{server['name']}: listening", server["listen"], port)
    audit.expect(f"{server['name']}: listening", server["listen"], on_port or f"nothing on port {port}",
                 passed=server["listen"] in on_port)


@servers_of("process", "unit")
def server_shm(case, audit):
    """`SERVER: /dev/shm size` — the /dev/shm the server's process sees: reported when it is the host's (the host's row checks that), else at least the profile's `shm_size_min`.

    Modes: profile.
    """
    server, shm = case.item, case.target["shm"]
    check = f"{server['name']}: /dev/shm size"
    seen = server["shm"]["bytes"]
    if server["shm"]["hosts"] or shm["size"] is None:
        audit.expect(check, REPORTED, f"{seen} bytes" + (" (the host's /dev/shm)" if server["shm"]["hosts"] else ""))
        return
    audit.expect(check, f"at least {shm['bytes']} bytes ({shm['size']})", f"{seen} bytes (its own /dev/shm)",
                 passed=seen is not None and seen >= shm["bytes"])


@servers
def server_started_by(case, audit):
    """`SERVER: started by` — how the server was started, whatever started it: systemd unit, transient unit, user unit of USER, a crontab line (`root's crontab (@reboot)`), tmux/screen, nohup, a shell, a script, a container (reported).

    Modes: profile.
    """
    audit.expect(f"{case.item['name']}: started by", REPORTED, case.item["started_by"])


@servers
def server_restart_pending(case, audit):
    """`SERVER: restart pending` — the server's running process against the files it was started from (its --config file, the program or launcher script it runs): none changed after the process started.

    Modes: profile.

    The rows that read its --config file read the file as it is now: with a restart pending, the server may run
    other values (`restart pending: /etc/vllm/chat.yaml (changed TIME), after pid N started TIME`). A file whose
    time could not be read makes the row an error that names it.
    """
    check, restart = f"{case.item['name']}: restart pending", case.item["restart"]
    if restart["passed"] is None:
        audit.unknown(check, NO_RESTART_PENDING, restart["actual"])
    audit.expect(check, NO_RESTART_PENDING, restart["actual"], passed=restart["passed"])


@servers
def server_vllm(case, audit):
    """`SERVER: vLLM running` — the vLLM version the server's process imported: its maps (vLLM's shared objects, the dist-info beside them, `(deleted)` where replaced since), else its API's /version (reported).

    Modes: profile.
    """
    audit.expect(f"{case.item['name']}: vLLM running", REPORTED, case.item["version"])


@servers
def server_ipc(case, audit):
    """`SERVER: IPC` — the server's IPC namespace (a container: its IPC mode) (reported).

    Modes: profile.
    """
    audit.expect(f"{case.item['name']}: IPC", REPORTED, case.item["ipc"])


@servers
def server_gpus(case, audit):
    """`SERVER: GPUs` — the GPUs where the server's process tree holds memory (nvidia-smi's compute processes), how much, and its memory share (reported).

    Modes: profile.
    """
    server = case.item
    found = case.target["gpus_found"]
    held = [f"GPU {gpu['index'] if gpu['index'] is not None else '?'} ({gpu['uuid']}): {gpu['mib']} MiB"
            for gpu in server["gpus"]]
    if held:
        actual = held + [f"share {server['share']:.2f} ({server['share_source']})"]
    elif found["problem"]:
        actual = f"unknown ({found['problem']})"
    else:
        actual = f"none: no process of its tree holds GPU memory (share {server['share']:.2f}, {server['share_source']})"
    audit.expect(f"{server['name']}: GPUs", REPORTED, actual)


@gpu_cards
def gpu_memory_shares(case, audit):
    """`GPU N: memory shares` — the sum of the --gpu-memory-utilization of the vLLM servers holding memory on the card (at most 1.0), and its used and total memory.

    Modes: profile.
    """
    card = case.item
    audit.expect(f"GPU {card['index']}: memory shares", SHARES, card["actual"], passed=card["passed"])
