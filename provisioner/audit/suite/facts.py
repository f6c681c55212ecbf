"""What a host has, read in ONE SSH round trip and parsed for the checks.

The commands to run follow from the host's expectations (which files, which sysctl keys, which
units); they run as one shell script through testinfra, each one's output and exit status framed
by a marker line. One read per host keeps an audit of ~50 checks well under two seconds.
"""

from __future__ import annotations

import base64
import json
import re
import secrets
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import testinfra

from provisioner.audit.text import environment_words, shown_argv
from provisioner.base.module_utils import driver_state, sysctl_files
from provisioner.base.paths import module_utils_file, role_dir
from provisioner.base.unreachable import LOST, explain
from provisioner.gpu.facts import GpuFacts, facts_from_data
from provisioner.gpu.smi import SmiError, query_arguments, read_smi_facts

HTTP_PROBE = Path(__file__).with_name("http_probe.sh")  # bash /dev/tcp: plain http
HTTPS_PROBE = Path(__file__).with_name("http_probe.py")  # python's ssl: https
MONITORING_PROBE = Path(__file__).with_name("monitoring_probe.py")  # node_exporter's and Prometheus's answers
READY_PROBE = role_dir("vllm_service") / "files" / "wait-ready"  # the units' own readiness probe
PROBE_TIMEOUT_S = 10
# the sysctl.d files as JSON, read on the host by the same code the role's module runs (read_tree)
SYSCTL_READER = module_utils_file("sysctl_files")
# HAProxy's routes and the drains vllm-provision recorded, read on the gateway host by the modules' own code
HAPROXY_READER = module_utils_file("haproxy_runtime")
MODPROBE_DIRS = ("/etc/modprobe.d", "/run/modprobe.d", "/usr/local/lib/modprobe.d", "/lib/modprobe.d", "/usr/lib/modprobe.d")
BOOT_UNIT_STATE = ("LoadState", "UnitFileState", "ActiveState", "SubState", "Result", "ExecMainStatus",
                   "ExecMainExitTimestamp")
# the venv's vLLM version without importing vllm (slow; the real one may need CUDA)
# the venvs of role vllm_install: where `current` and `previous` link, every version's venv, the
# unversioned venv of earlier releases; one KEY=VALUE line each (venvs: space-separated folder names)
VLLM_VENVS = ("echo current=$(readlink {current}); echo previous=$(readlink {previous}); "
              "echo venvs=$(ls -1 {venvs} 2>/dev/null | sort -V); [ -d {unversioned} ] && echo unversioned={unversioned}; true")
VLLM_VERSION = """\
import importlib.metadata as metadata
try:
    print(metadata.version("vllm"))
except metadata.PackageNotFoundError:
    print("(not installed)")
    raise SystemExit(3)
"""
UNIT_STATE = ("LoadState", "LoadError", "FragmentPath", "UnitFileState", "ActiveState", "SubState", "NeedDaemonReload",
              "Environment", "ExecStart", "DropInPaths")
# role nvidia_driver's: the release, the packages dpkg knows (the module's own format), the driver module's
# version for each kernel DKMS builds for (those with headers: /lib/modules/K/build), the loaded module's
DRIVER_RELEASE = '. /etc/os-release && echo "$VERSION_CODENAME"'
DRIVER_MODULES = ('for dir in /lib/modules/*/; do kernel=$(basename "$dir"); [ -e "$dir/build" ] || continue; '
                  'for module in {modules}; do echo "$kernel $module $(modinfo -k "$kernel" -F version "$module" 2>/dev/null)"; '
                  'done; done')
INITRAMFS_SCRIPT = """\
image=/boot/initrd.img-$(uname -r)
if [ ! -e "$image" ]; then echo "no initramfs at $image"; exit 3; fi
if ! command -v lsinitramfs >/dev/null; then echo "no lsinitramfs to read $image"; exit 3; fi
echo "$image"; lsinitramfs "$image" | grep -x -F {path}"""


@dataclass
class Output:
    text: str
    rc: int


@dataclass
class UnitFacts:
    shown: dict[str, str]  # `systemctl show` properties
    environment: dict[str, str]  # Environment= and the EnvironmentFile= variables the checks ask about
    env_file: tuple[str, str] | None  # (mode, owner:group) of the expected env file; None: absent
    env_file_sha256: str | None
    http: dict[str, Any]
    config_text: str | None = None  # the expected --config file's content; None: absent
    ready: Output | None = None  # the readiness probe's verdict (exit 0: ready) and its line
    dropins: list[tuple[str, str]] = field(default_factory=list)  # (path, content) of each DropInPaths file, in order
    dropin_modes: dict[str, str] = field(default_factory=dict)  # path → mode (0644) of each DropInPaths file

    @property
    def argv(self) -> list[str]:
        return shown_argv(self.shown.get("ExecStart", ""))


@dataclass
class ContainerFacts:
    inspect: dict[str, Any] | None  # `<engine> inspect <name>`; None: no such container
    unit: dict[str, str]  # podman: `systemctl show` of the quadlet's unit (ActiveState, Restart)
    env_file: tuple[str, str] | None
    env_file_sha256: str | None
    config_text: str | None
    http: dict[str, Any]

    def host_config(self, key: str) -> Any:
        return ((self.inspect or {}).get("HostConfig") or {}).get(key)

    @property
    def environment(self) -> dict[str, str]:
        words = ((self.inspect or {}).get("Config") or {}).get("Env") or []
        return dict(word.split("=", 1) for word in words if "=" in word)


@dataclass
class HostFacts:
    container: str | None  # what systemd-detect-virt --container says; None: not a container
    # what systemd-sysctl sets at boot, by normalised key: (value, the winning file as shown); None: the files
    # could not be read (sysctl_problem says why). The precedence: plugins/module_utils/sysctl_files.py
    sysctl_at_boot: dict[str, tuple[str | None, str]] | None
    sysctl_problem: str | None
    sysctl_live: dict[str, str | None]
    files: dict[str, str | None]
    modprobe_lines: set[str]
    modules: set[str]
    modprobe_dry_runs: dict[str, Output]  # module → what `modprobe -n -v module` would do
    cmdline: list[str]
    initramfs: Output | None
    reboot_lines: set[str]
    fstab: str
    shm_bytes: int | None
    page_size: int
    listening: set[str]
    # (local address, peer address) of each established TCP connection; read where a unit is a multi-node node
    established: list[tuple[str, str]] = field(default_factory=list)
    units: dict[str, UnitFacts] = field(default_factory=dict)
    containers: dict[str, ContainerFacts] = field(default_factory=dict)
    gpu: GpuFacts | None = None  # read when GPUs are expected
    gpu_problem: str | None = None  # why they could not be read
    gpu_boot_unit: dict[str, str] | None = None  # `systemctl show` of the nvidia_gpu role's boot unit
    gateway: dict[str, str] | None = None  # `systemctl show` of role gateway's haproxy.service
    # HAPROXY_READER's answer: {backends: {backend: {server: state}}, records: {BACKEND/SERVER: record}} or {error}
    gateway_routes: dict[str, Any] | None = None
    # MONITORING_PROBE's answer: {exporter: {answers, nvsmi_up, nvsmi_age_s} or {error}, prometheus: {targets} or {error}}
    monitoring: dict[str, Any] | None = None
    monitoring_problem: str | None = None  # why the probe gave no answer
    # role nvidia_driver's (where it manages the driver): the release codename, {package: {version, want, status}},
    # {kernel: {module: version or ""}} for the kernels with headers, the loaded nvidia module's version (None: not loaded)
    driver_release: str | None = None
    driver_packages: dict[str, dict[str, str]] = field(default_factory=dict)
    driver_modules: dict[str, dict[str, str]] = field(default_factory=dict)
    driver_loaded: str | None = None
    vllm_version: Output | None = None  # the venv's vLLM version (VLLM_VERSION's output and exit status)
    # NVIDIA's container toolkit: the package's `Version db:Status-Abbrev` ('' when not installed), and
    # `systemctl show` of the CDI refresh path unit
    toolkit_package: str | None = None
    toolkit_unit: dict[str, str] = field(default_factory=dict)
    vllm_venvs: dict[str, str] = field(default_factory=dict)  # VLLM_VENVS: current, previous, venvs, unversioned
    # each managed file (expected["managed_files"]) by path: ((mode, owner:group), its content); None: absent
    managed_files: dict[str, tuple[tuple[str, str], str] | None] = field(default_factory=dict)


def read_facts(host: testinfra.host.Host, expected: dict[str, Any]) -> HostFacts:
    commands = host_commands(expected)
    outputs = run_commands(host, commands)
    return parse_facts(expected, outputs)


class HostLost(ConnectionError):
    """The host stopped answering after the audit connected to it."""


def run_commands(host: testinfra.host.Host, commands: dict[str, str]) -> dict[str, Output]:
    """Run every command in one SSH round trip; name → its output (stdout and stderr) and exit status."""
    marker = f"@@vp-audit-{secrets.token_hex(6)}"
    script = "".join(
        f"echo '{marker} {name}'; ( {command}\n) 2>&1; rc=$?; echo; echo \"{marker} rc $rc\"\n"
        for name, command in commands.items()
    )
    result = host.run(script)
    if result.rc == 255 and marker not in result.stdout:  # ssh itself failed: the host was lost since it connected
        raise HostLost(f"{LOST} {explain(result.stderr)}")
    if result.rc != 0 and marker not in result.stdout:
        raise RuntimeError(f"reading the host failed (exit {result.rc}): {result.stderr.strip()[-500:]}")
    return parse_outputs(result.stdout, marker)


def parse_outputs(stdout: str, marker: str) -> dict[str, Output]:
    pattern = re.compile(rf"^{re.escape(marker)} (\S+)\n(.*?)\n{re.escape(marker)} rc (\d+)$", re.S | re.M)
    return {name: Output(text, int(rc)) for name, text, rc in pattern.findall(stdout)}


def host_commands(expected: dict[str, Any]) -> dict[str, str]:
    sysctl, nouveau, shm = expected["sysctl"], expected["nouveau"], expected["shm"]
    commands = {
        "virt": "systemd-detect-virt --container",
        # JSON, not cat-config's "# /path" headers, which a comment line in a file can imitate
        "sysctl": "python3 -c " + shlex.quote(
            SYSCTL_READER.read_text() + "\nimport json\nprint(json.dumps(read_tree('/')))\n"),
        "modprobe": "cat " + " ".join(f"{directory}/*.conf" for directory in MODPROBE_DIRS) + " 2>/dev/null",
        "modules": "cut -d' ' -f1 /proc/modules",
        "cmdline": "cat /proc/cmdline",
        "fstab": "cat /etc/fstab",
        "shm": "findmnt -n -b -o SIZE /dev/shm",
        "page_size": "getconf PAGESIZE",
        "listening": "ss -Hltn",
    }
    if any(unit.get("group") for unit in expected["units"]):  # the nodes of multi-node instances: their connections
        commands["established"] = "ss -Htn state established"
    for index, key in enumerate(sysctl["settings"]):
        commands[f"live{index}"] = f"cat {shlex.quote(proc_sys_path(key))}"
    for index, path in enumerate(nouveau_files(nouveau)):
        commands[f"file{index}"] = f"cat {shlex.quote(path)}"
    for index, module in enumerate(nouveau.get("modules", [])):
        commands[f"modprobe_dry{index}"] = f"modprobe -n -v {shlex.quote(module)}"
    if nouveau.get("initramfs_file"):
        commands["initramfs"] = INITRAMFS_SCRIPT.format(path=shlex.quote(nouveau["initramfs_file"]))
    if nouveau.get("reboot_marker"):
        commands["reboot"] = f"cat {shlex.quote(nouveau['reboot_marker']['path'])}"
    for index, unit in enumerate(expected["units"]):
        commands.update(unit_commands(index, unit))
    for index, container in enumerate(expected.get("vllm_containers", [])):
        commands.update(container_commands(index, container))
    if expected.get("gpu") or expected.get("driver"):
        # the query alone: the checks need no topology (read_smi_facts leaves the links unknown); its
        # driver_version is the driver row's actual value too
        commands["gpu"] = shlex.join([gpu_reader(expected), *query_arguments()])
    if expected.get("driver_install"):
        commands.update(driver_install_commands(expected["driver_install"]))
    if expected.get("gpu_boot_unit"):
        commands["gpu_boot_unit"] = (f"systemctl show {shlex.quote(expected['gpu_boot_unit']['name'])}"
                                     f" --property={','.join(BOOT_UNIT_STATE)}")
    if expected.get("gateway"):
        commands["gateway"] = (f"systemctl show {shlex.quote(expected['gateway']['name'])}"
                               " --property=LoadState,UnitFileState,ActiveState")
        commands["gateway_routes"] = shlex.join(["python3", "-c", HAPROXY_READER.read_text(), "read",
                                                 expected["gateway"]["record_dir"], expected["gateway"]["socket"]])
    if expected.get("monitoring"):
        urls = [expected["monitoring"]["exporter"]["url"]] + (
            [expected["monitoring"]["prometheus"]["url"]] if expected["monitoring"].get("prometheus") else [])
        commands["monitoring"] = (f"timeout {2 * PROBE_TIMEOUT_S} python3 -c {shlex.quote(MONITORING_PROBE.read_text())} "
                                  + " ".join(map(shlex.quote, urls)))
    if expected.get("container_toolkit"):
        toolkit = expected["container_toolkit"]
        commands["toolkit_package"] = (f"dpkg-query --show --showformat='${{Version}} ${{db:Status-Abbrev}}' "
                                       f"{shlex.quote(toolkit['package'])} 2>/dev/null; true")
        commands["toolkit_unit"] = (f"systemctl show {shlex.quote(toolkit['path_unit'])}"
                                    " --property=LoadState,UnitFileState,ActiveState,SubState")
    if expected.get("vllm_install"):
        python = shlex.quote(f"{expected['vllm_install']['venv']}/bin/python")
        commands["vllm_version"] = f"[ -x {python} ] || {{ echo no {python}; exit 4; }}; {python} -c {shlex.quote(VLLM_VERSION)}"
        install = expected["vllm_install"]
        commands["vllm_venvs"] = VLLM_VENVS.format(**{key: shlex.quote(install[key]) for key in
                                                      ("current", "previous", "venvs", "unversioned")})
    for index, managed in enumerate(expected.get("managed_files", [])):
        path = shlex.quote(managed["path"])
        # mode and owner, then the content in base64 (one line: no framing to escape)
        commands[f"managed{index}"] = f"stat -c '%a %U:%G' {path} && base64 -w0 {path}"
    return commands


def driver_install_commands(install: dict[str, Any]) -> dict[str, str]:
    modules = sorted({chosen["module"] for chosen in install["sets"].values() if isinstance(chosen, dict)})
    return {
        "driver_release": DRIVER_RELEASE,
        "driver_packages": f"dpkg-query --show --showformat={shlex.quote(driver_state.DPKG_FORMAT)}",
        "driver_modules": DRIVER_MODULES.format(modules=" ".join(map(shlex.quote, modules))),
        "driver_loaded": "cat /sys/module/nvidia/version",
    }


def gpu_reader(expected: dict[str, Any]) -> str:
    """The nvidia-smi the GPU and driver rows read with (the nvidia_gpu role's)."""
    return (expected.get("gpu") or expected["driver"])["nvidia_smi"]


def unit_commands(index: int, unit: dict[str, Any]) -> dict[str, str]:
    name = shlex.quote(unit["name"])
    properties = ",".join([*UNIT_STATE, *unit["properties"]])
    variables = "|".join(map(re.escape, unit["environment"])) or "^$"
    commands = {
        f"unit{index}": f"systemctl show {name} --property={properties}",
        # only the variables the checks ask about: an env file may hold secrets
        f"unit_env{index}": (
            f"systemctl show {name} -p EnvironmentFiles --value | while read -r file rest; do cat \"$file\"; done"
            f" | grep -E {shlex.quote(f'^({variables})=')}"
        ),
    }
    headless = bool((unit.get("group") or {}).get("headless"))  # a follower node: no API to ask
    if not headless:
        commands[f"http{index}"] = http_probe_command(name, unit["url"])
    # each drop-in systemd applies: its path, then its content in base64 (one line: no framing to escape)
    commands[f"dropins{index}"] = (
        f"for file in $(systemctl show {name} -p DropInPaths --value); do echo \"$file\"; base64 -w0 \"$file\" 2>/dev/null; echo; done")
    commands[f"dropin_modes{index}"] = (
        f"for file in $(systemctl show {name} -p DropInPaths --value); do stat -c '%a %n' \"$file\"; done")
    # one real request through the same probe the unit runs before it turns active
    commands[f"ready{index}"] = "true" if headless else (
        f"timeout {PROBE_TIMEOUT_S + 2} python3 -c {shlex.quote(READY_PROBE.read_text())} --base-url {shlex.quote(unit['url'])}"
        f" --model {shlex.quote(unit['served_names'][0])} --timeout {PROBE_TIMEOUT_S} --once --key-from-unit {name}")
    if unit.get("env_file"):
        commands[f"env_file{index}"] = env_file_command(unit["env_file"]["path"])
    if unit.get("config_file"):
        commands[f"config{index}"] = f"cat {shlex.quote(unit['config_file']['path'])}"
    return commands


def http_probe_command(name: str, url: str) -> str:
    """/health and /v1/models of the server at `url`, from the host itself (a unit's name: its API key)."""
    scheme, _, address = url.partition("://")
    host, _, port = address.rpartition(":")
    host = shlex.quote(host.strip("[]"))
    probe = f"python3 -c {shlex.quote(HTTPS_PROBE.read_text())}" if scheme == "https" else (
        f"bash -c {shlex.quote(HTTP_PROBE.read_text())} {host}")  # $0: bash's messages name the host, not the unit
    return f"timeout {PROBE_TIMEOUT_S} {probe} {name} {host} {shlex.quote(port)}"


def env_file_command(path: str) -> str:
    """Its mode, owner and sha256, read by `env_file_stat`."""
    quoted = shlex.quote(path)
    return f"stat -c '%a %U:%G' {quoted} && sha256sum {quoted}"


def container_commands(index: int, container: dict[str, Any]) -> dict[str, str]:
    name = shlex.quote(container["name"])
    commands = {f"container{index}": f"{container['engine']} inspect {name}"}
    unit = container["unit"] or container["boot_unit"]
    commands[f"container_unit{index}"] = f"systemctl show {shlex.quote(unit)} --property=ActiveState,Restart,UnitFileState"
    commands[f"container_http{index}"] = http_probe_command(name, container["url"])
    commands[f"container_env_file{index}"] = env_file_command(container["env_file"]["path"])
    commands[f"container_config{index}"] = f"cat {shlex.quote(container['config_file']['path'])}"
    return commands


def nouveau_files(nouveau: dict[str, Any]) -> list[str]:
    return [*nouveau.get("files", {}), *nouveau.get("absent_files", [])]


def proc_sys_path(key: str) -> str:
    """sysctl's own rule: a key with a slash is already a path, dots in it are literal."""
    return "/proc/sys/" + (key if "/" in key else key.replace(".", "/"))


# --------------------------------------------------------------------------- parsing


def parse_facts(expected: dict[str, Any], out: dict[str, Output]) -> HostFacts:
    sysctl, nouveau = expected["sysctl"], expected["nouveau"]
    at_boot, sysctl_problem = parse_sysctl(out["sysctl"])
    facts = HostFacts(
        container=out["virt"].text.strip() if out["virt"].rc == 0 else None,
        sysctl_at_boot=at_boot,
        sysctl_problem=sysctl_problem,
        sysctl_live={
            key: " ".join(out[f"live{index}"].text.split()) if out[f"live{index}"].rc == 0 else None
            for index, key in enumerate(sysctl["settings"])
        },
        files={
            path: out[f"file{index}"].text if out[f"file{index}"].rc == 0 else None
            for index, path in enumerate(nouveau_files(nouveau))
        },
        modprobe_lines={" ".join(line.split()) for line in out["modprobe"].text.splitlines()},
        modules=set(out["modules"].text.split()),
        modprobe_dry_runs={module: out[f"modprobe_dry{index}"] for index, module in enumerate(nouveau.get("modules", []))},
        cmdline=out["cmdline"].text.split(),
        initramfs=out.get("initramfs"),
        reboot_lines=set(out["reboot"].text.splitlines()) if "reboot" in out and out["reboot"].rc == 0 else set(),
        fstab=out["fstab"].text,
        shm_bytes=int(out["shm"].text) if out["shm"].rc == 0 and out["shm"].text.strip().isdigit() else None,
        page_size=int(out["page_size"].text),
        listening={line.split()[3] for line in out["listening"].text.splitlines() if len(line.split()) > 3},
        established=connections(out["established"]) if "established" in out else [],
    )
    for index, unit in enumerate(expected["units"]):
        facts.units[unit["name"]] = parse_unit(index, out)
    for index, container in enumerate(expected.get("vllm_containers", [])):
        facts.containers[container["name"]] = parse_container(index, out)
    if "gpu" in out:
        facts.gpu, facts.gpu_problem = parse_gpu(out["gpu"], gpu_reader(expected))
    if "gpu_boot_unit" in out:
        facts.gpu_boot_unit = dict(line.split("=", 1) for line in out["gpu_boot_unit"].text.splitlines() if "=" in line)
    if "gateway" in out:
        facts.gateway = dict(line.split("=", 1) for line in out["gateway"].text.splitlines() if "=" in line)
    if "gateway_routes" in out:
        answer, problem = json_answer(out["gateway_routes"], dict)
        facts.gateway_routes = answer if answer is not None else {"error": problem}
    if "monitoring" in out:
        facts.monitoring, facts.monitoring_problem = json_answer(out["monitoring"], dict)
    if "driver_release" in out:
        parse_driver_install(facts, out)
    facts.vllm_version = out.get("vllm_version")
    if "toolkit_package" in out:
        facts.toolkit_package = out["toolkit_package"].text.strip()
        facts.toolkit_unit = dict(line.split("=", 1) for line in out["toolkit_unit"].text.splitlines() if "=" in line)
    if "vllm_venvs" in out:
        facts.vllm_venvs = dict(line.split("=", 1) for line in out["vllm_venvs"].text.splitlines() if "=" in line)
    for index, managed in enumerate(expected.get("managed_files", [])):
        facts.managed_files[managed["path"]] = managed_file(out[f"managed{index}"])
    return facts


def connections(out: Output) -> list[tuple[str, str]]:
    """(local, peer) of `ss -Htn state established`'s lines (a State column first, where ss shows one)."""
    found = []
    for line in out.text.splitlines():
        words = line.split()
        words = words[1:] if words and words[0].isalpha() else words
        if len(words) > 3:
            found.append((words[2], words[3]))
    return found


def parse_driver_install(facts: HostFacts, out: dict[str, Output]) -> None:
    facts.driver_release = out["driver_release"].text.strip() or None
    facts.driver_packages = driver_state.parse_dpkg_query(out["driver_packages"].text)
    for line in out["driver_modules"].text.splitlines():
        kernel, module, *version = line.split()
        facts.driver_modules.setdefault(kernel, {})[module] = version[0] if version else ""
    facts.driver_loaded = out["driver_loaded"].text.strip() if out["driver_loaded"].rc == 0 else None


def managed_file(out: Output) -> tuple[tuple[str, str], str] | None:
    """((mode, owner:group), content) of the managed-file command's output; None: absent (or unreadable)."""
    lines = out.text.splitlines()
    if out.rc != 0 or not lines:
        return None
    mode, owner = lines[0].split()
    content = base64.b64decode(lines[1] if len(lines) > 1 else "").decode("utf-8", "replace")
    return (mode.zfill(4), owner), content


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


def parse_sysctl(out: Output) -> tuple[dict[str, tuple[str | None, str]] | None, str | None]:
    """The reader's JSON → ({normalised key: (value at boot, winning file)}, None), or (None, why not)."""
    entries, problem = json_answer(out, list)
    if problem:
        return None, f"could not read the sysctl.d files ({problem})"
    winners = sysctl_files.effective(sysctl_files.conf_files(entries))
    return {key: (won["value"], sysctl_files.shown_path(won["entry"])) for key, won in winners.items()}, None


def parse_gpu(out: Output, nvidia_smi: str) -> tuple[GpuFacts | None, str | None]:
    """The GPU facts of `nvidia-smi --query-gpu` (the module's own parser), or why there are none."""
    if out.rc != 0:
        lines = out.text.strip().splitlines()
        why = "not on the PATH" if out.rc == 127 else f"exited {out.rc}: {lines[-1] if lines else 'no output'}"
        return None, f"{nvidia_smi} {why}"

    def answer(arguments: list[str]) -> str:
        if arguments != query_arguments():
            raise SmiError("the audit reads no topology")
        return out.text

    try:
        return facts_from_data(read_smi_facts(answer)), None
    except SmiError as error:
        return None, f"{nvidia_smi}: {error}"


def parse_unit(index: int, out: dict[str, Output]) -> UnitFacts:
    shown = dict(line.split("=", 1) for line in out[f"unit{index}"].text.splitlines() if "=" in line)
    environment = environment_words(shown.get("Environment", ""))
    environment.update(line.split("=", 1) for line in out[f"unit_env{index}"].text.splitlines() if "=" in line)
    stat, sha256 = env_file_stat(out.get(f"env_file{index}"))
    config = out.get(f"config{index}")
    http = out.get(f"http{index}")
    return UnitFacts(shown, environment, stat, sha256, http_answers(http.text) if http else {},
                     config.text if config is not None and config.rc == 0 else None, out.get(f"ready{index}"),
                     dropin_files(out.get(f"dropins{index}")), dropin_modes(out.get(f"dropin_modes{index}")))


def dropin_modes(out: Output | None) -> dict[str, str]:
    """{path: mode} of the drop-in modes command's lines (`644 /etc/systemd/system/x.service.d/y.conf`)."""
    lines = out.text.splitlines() if out is not None else []
    return {path: mode.zfill(4) for mode, _, path in (line.partition(" ") for line in lines) if path}


def dropin_files(out: Output | None) -> list[tuple[str, str]]:
    """[(path, content)] of the drop-ins command's lines: a path, then the file's content in base64."""
    lines = out.text.splitlines() if out is not None else []
    return [(path, base64.b64decode(encoded).decode("utf-8", "replace")) for path, encoded in zip(lines[::2], lines[1::2])]


def parse_container(index: int, out: dict[str, Output]) -> ContainerFacts:
    inspect = out[f"container{index}"]
    try:
        found = json.loads(inspect.text) if inspect.rc == 0 else []
    except ValueError:
        found = []
    unit = out.get(f"container_unit{index}")
    shown = dict(line.split("=", 1) for line in unit.text.splitlines() if "=" in line) if unit else {}
    stat, sha256 = env_file_stat(out[f"container_env_file{index}"])
    config = out[f"container_config{index}"]
    return ContainerFacts(found[0] if found else None, shown, stat, sha256,
                          config.text if config.rc == 0 else None, http_answers(out[f"container_http{index}"].text))


def env_file_stat(out: Output | None) -> tuple[tuple[str, str] | None, str | None]:
    """((mode, owner:group), sha256) of `stat -c '%a %U:%G' FILE && sha256sum FILE`; (None, None): absent."""
    if out is None or out.rc != 0:
        return None, None
    first, second = out.text.splitlines()[:2]
    mode, owner = first.split()
    return (mode.zfill(4), owner), second.split()[0]


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
