"""The gate before any host is touched: what `plan` reports and `apply_spec` refuses to run with.

- memory: an instance that would not fit its GPU (vLLM checks memory when it starts and refuses). Only
  the chosen hosts are planned, and only their memory: no files are rendered.
- driver: a host whose NVIDIA driver is older than the vLLM builds its instances run need (the CUDA
  runtime refuses to start: provisioner/vllm/cuda_drivers.py). The driver is the one the spec names
  (managed: `driver.branch`, or `driver.version`; declared: `driver.version` with `manage: false`), else
  the one the host has: `plan` never connects and says so; apply reads it (`read_driver`, one short
  command over the remote layer) once the host's key is trusted, before the playbook runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from provisioner.fleet.remote import HostShell, RemoteError
from provisioner.spec import Host, Instance, Spec
from provisioner.spec.driver import BuildUse, builds_used, unchecked_images
from provisioner.validation.memory_plan import GpuMemory, host_memory
from provisioner.vllm.builds import Build, builds_of
from provisioner.vllm.cuda_drivers import branch_of, is_driver_version

MEMORY, DRIVER = "memory", "driver"
DEBIAN_STOPS = "Debian's own packages stop at 535 on bookworm and 550 on trixie"
FIRST_OPEN_DEFAULT_BRANCH = 560  # the first branch neither Debian release packages (and the open modules' default)


@dataclass(frozen=True)
class GateProblem:
    """One reason the chosen hosts would not run what the spec asks: its kind (memory, driver), the line, and
    the field of the spec it is about (hosts[0].driver.branch, hosts[0].gpus.devices[1])."""

    kind: str
    message: str
    field: str

    def __str__(self) -> str:
        return self.message


class PreflightError(ValueError):
    """The chosen hosts would not run what the spec asks: `problems`, one line each."""

    def __init__(self, problems: list[GateProblem]):
        super().__init__("; ".join(map(str, problems)))
        self.problems = problems


def memory_problems(host_name: str, memory: list[GpuMemory]) -> list[str]:
    """'HOST GPU 0: problem' for each problem of the host's memory plan."""
    return [f"{host_name} {gpu.label}: {problem}" for gpu in memory for problem in gpu.problems]


# --------------------------------------------------------------------------- the driver


@dataclass(frozen=True)
class KnownDriver:
    """What is known of a host's driver: a branch ("580") or a version ("580.95.05"), and from where."""

    version: str
    source: str  # driver.branch, driver.version, read from the host (<how>)
    managed: bool = False

    @property
    def shown(self) -> str:
        return f"{self.version} ({self.source})"

    @property
    def branch(self) -> int:
        return branch_of(self.version) or 0


def declared_driver(host: Host) -> KnownDriver | None:
    """The driver the spec names for the host; None where apply has to read it from the host."""
    driver = host.driver
    if driver is None or (not driver.manage and driver.version is None):
        return None
    if driver.version is not None:
        return KnownDriver(driver.version, "driver.version", driver.manage)
    return KnownDriver(driver.branch, "driver.branch", managed=True)


@dataclass(frozen=True)
class DriverCheck:
    """The driver gate on one host: what its vLLM builds need, what is known of its driver, and the verdict."""

    host: str
    driver: KnownDriver | None
    needs: tuple[BuildUse, ...]
    problems: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def needed(self) -> str:
        return needed(self.needs)


def needed(needs: Iterable[BuildUse]) -> str:
    """`vLLM 0.25.0 (CUDA 13.0) needs ≥ 580`, for each build a host runs."""
    return "; ".join(f"{_what(use)} needs ≥ {use.minimum_branch}" for use in needs if use.minimum_branch is not None)


NOT_READ = object()  # the host's driver was not read (plan; a declared driver)


def driver_check(host: Host, instances: list[Instance], observed: KnownDriver | None | object = NOT_READ) -> DriverCheck:
    """The driver gate on `host`: the declared driver, else `observed` (read from the host; None: it has
    none), against each vLLM build its instances run."""
    needs = tuple(builds_used(host, instances))
    driver = declared_driver(host) or (None if observed is NOT_READ else observed)
    warnings = _source_warnings(host)
    notes = [f"the image {image} of {', '.join(names)} names no vLLM version this tool knows: the driver it needs "
             "is not checked" for image, names in unchecked_images(host, instances).items()]
    if not needs:
        return DriverCheck(host.name, driver, needs, (), tuple(warnings), tuple(notes))
    problems: list[str] = []
    if driver is None and observed is NOT_READ:
        notes.insert(0, f"driver not declared: apply reads it from the host — {needed(needs)}")
    elif driver is None:
        problems.append(_no_driver(host, needs))
    else:
        notes.insert(0, f"driver {driver.shown} — {needed(needs)}")
        for use in needs:
            rule = use.build.rule
            if rule is None:
                continue
            if driver.branch < rule.minimum_branch:
                problems.append(_too_old(host, driver, use))
            elif rule.advised_branch and driver.branch < rule.advised_branch:
                warnings.append(f"driver {driver.shown} runs {_what(use)} only through CUDA minor-version "
                                f"compatibility, where {rule.risk} — a driver of branch {rule.advised_branch} or "
                                "later avoids it")
    return DriverCheck(host.name, driver, needs, tuple(problems), tuple(warnings), tuple(notes))


def _what(use: BuildUse) -> str:
    if use.image is None:
        return use.build.label
    return f"the image {use.image} of {', '.join(use.instances)} (vLLM {use.build.version}, CUDA {use.build.cuda})"


def _too_old(host: Host, driver: KnownDriver, use: BuildUse) -> str:
    minimum = use.minimum_branch
    if driver.managed:
        fix = f"set driver.branch: \"{minimum}\" with source: nvidia ({DEBIAN_STOPS})"
    else:
        fix = (f"install a driver of branch {minimum} or later, or let apply do it: driver: {{source: nvidia, "
               f"branch: \"{minimum}\"}} ({DEBIAN_STOPS})")
    older = _older_build(use, driver.branch)
    if older is not None:
        index = f" ({older.index_url})" if older.index_url else ""
        fix += f", or install vLLM {older.version}'s CUDA {older.cuda} build: vllm.cuda: \"{older.cuda}\"{index}"
    return f"{host.name}: driver {driver.shown} is too old for {_what(use)}, which needs driver ≥ {minimum} — {fix}"


def _older_build(use: BuildUse, branch: int) -> Build | None:
    """Another build of the host's venv vLLM that `branch` runs (the newest CUDA of them); None for an image."""
    if use.image is not None:
        return None
    fitting = [build for build in builds_of(use.build.version)
               if build != use.build and build.minimum_branch is not None and build.minimum_branch <= branch]
    return max(fitting, key=lambda build: tuple(map(int, build.cuda.split("."))), default=None)


def _no_driver(host: Host, needs: tuple[BuildUse, ...]) -> str:
    minimum = max(use.minimum_branch for use in needs if use.minimum_branch is not None)
    return (f"{host.name}: no NVIDIA driver found (no nvidia module loaded or installed, no nvidia-smi) — "
            f"{needed(needs)}: install one, or let apply do it: driver: {{source: "
            f"nvidia, branch: \"{minimum}\"}}")


def _source_warnings(host: Host) -> list[str]:
    driver = host.driver
    if driver is None or not driver.manage or driver.source != "distribution":
        return []
    if int(driver.branch) < FIRST_OPEN_DEFAULT_BRANCH:
        return []
    return [f"driver.source distribution with branch {driver.branch}: {DEBIAN_STOPS} — on Debian use source: "
            "nvidia (Ubuntu's own archive has newer branches)"]


# --------------------------------------------------------------------------- reading the driver on a host

# One round trip: the loaded module's version, else what nvidia-smi says (a driver whose module is not
# loaded yet, or a container), else the module installed for the running kernel (Debian names it
# nvidia-current). `<how> <version>`, or `none`.
READ_DRIVER = """\
PATH="$PATH:/usr/sbin:/sbin"
v=$(cat /sys/module/nvidia/version 2>/dev/null) && [ -n "$v" ] && { echo "loaded $v"; exit 0; }
v=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | grep -m1 -E '^[0-9]+[.][0-9]') && { echo "nvidia-smi $v"; exit 0; }
for m in nvidia nvidia-current; do v=$(modinfo -F version "$m" 2>/dev/null) && [ -n "$v" ] && { echo "installed $v"; exit 0; }; done
echo none"""
READ_TIMEOUT_S = 30
HOW_READ = {"loaded": "the loaded module", "nvidia-smi": "nvidia-smi", "installed": "installed, not loaded"}


def parse_driver_reading(output: str) -> KnownDriver | None:
    """READ_DRIVER's line as a KnownDriver; None when the host has no driver (or says nothing we can read)."""
    how, _, version = output.strip().partition(" ")
    if how not in HOW_READ or not is_driver_version(version):
        return None
    return KnownDriver(version.strip(), f"read from the host: {HOW_READ[how]}")


def read_driver(host: Host, spec_path: str | Path | None = None) -> KnownDriver | None:
    """The driver `host` has (READ_DRIVER over the remote layer); None: none; RemoteError: not read."""
    shell = HostShell.for_host(host, spec_path)
    return parse_driver_reading(shell.run(READ_DRIVER, timeout=READ_TIMEOUT_S).stdout)


DriverReader = Callable[[Host, str | Path | None], KnownDriver | None]


@dataclass
class DriverReadings:
    """What apply read on the hosts whose driver the spec does not name."""

    found: dict[str, KnownDriver | None] = field(default_factory=dict)  # host → its driver (None: it has none)
    failed: dict[str, str] = field(default_factory=dict)  # host → why it could not be read


def hosts_to_read(spec: Spec, hosts: Iterable[Host]) -> list[Host]:
    """The hosts whose driver apply reads: instances to run, and no driver the spec names."""
    return [host for host in hosts if declared_driver(host) is None and builds_used(host, spec.instances_on(host.name))]


def read_drivers(spec: Spec, hosts: list[Host], read: DriverReader = read_driver) -> DriverReadings:
    """`read` on every host, all at once."""
    readings = DriverReadings()
    if not hosts:
        return readings

    def one(host: Host) -> tuple[str, KnownDriver | None | RemoteError]:
        try:
            return host.name, read(host, spec.source_path)
        except RemoteError as error:
            return host.name, error

    with ThreadPoolExecutor(max_workers=min(len(hosts), 16)) as pool:
        for name, result in pool.map(one, hosts):
            if isinstance(result, RemoteError):
                readings.failed[name] = str(result)
            else:
                readings.found[name] = result
    return readings


# --------------------------------------------------------------------------- the gate


def driver_checks(spec: Spec, hosts: Iterable[Host], readings: DriverReadings | None = None) -> list[DriverCheck]:
    """The driver gate on each host (with `readings`: on what apply read where the spec names no driver)."""
    found = readings.found if readings is not None else {}
    return [driver_check(host, spec.instances_on(host.name), found[host.name] if host.name in found else NOT_READ)
            for host in hosts]


def preflight_problems(spec: Spec, hosts: Iterable[Host], readings: DriverReadings | None = None) -> list[GateProblem]:
    """What would keep an instance on `hosts` (of `spec`) from starting, one line each; none: []."""
    hosts = list(hosts)
    problems = [GateProblem(MEMORY, problem, gpu_field(spec, host, gpu.label))
                for host in hosts for gpu in host_memory(host, spec.instances_on(host.name))
                for problem in memory_problems(host.name, [gpu])]
    return problems + driver_problems(spec, hosts, readings)


def driver_problems(spec: Spec, hosts: Iterable[Host], readings: DriverReadings | None = None) -> list[GateProblem]:
    """The driver gate's problems on `hosts`, each at the field that names the driver (where apply read it:
    the host's driver section)."""
    return [GateProblem(DRIVER, problem, driver_field(spec, check)) for check in driver_checks(spec, hosts, readings)
            for problem in check.problems]


def host_field(spec: Spec, host_name: str) -> str:
    """hosts[2]: where the spec lists the host."""
    return f"hosts[{[host.name for host in spec.hosts].index(host_name)}]"


def gpu_field(spec: Spec, host: Host, label: str) -> str:
    """hosts[0].gpus.devices[1] for the device `label` (GPU 3) names; the host's devices where none does."""
    where = f"{host_field(spec, host.name)}.gpus.devices"
    index = next((index for index, device in enumerate(host.gpus.devices) if f"GPU {device.index}" == label), None)
    return where if index is None else f"{where}[{index}]"


def driver_field(spec: Spec, check: DriverCheck) -> str:
    """hosts[0].driver.branch (or .version) where the spec names the driver; hosts[0].driver where apply read it."""
    source = check.driver.source if check.driver is not None else ""
    return f"{host_field(spec, check.host)}.{source if source.startswith('driver.') else 'driver'}"


def check_readings(spec: Spec, hosts: Iterable[Host], readings: DriverReadings) -> None:
    """Raise PreflightError when a driver apply read (on `hosts`) is too old, or missing."""
    problems = driver_problems(spec, hosts, readings)
    if problems:
        raise PreflightError(problems)


def check_preflight(spec: Spec, hosts: Iterable[Host], readings: DriverReadings | None = None) -> None:
    """Raise PreflightError when `preflight_problems` finds any."""
    problems = preflight_problems(spec, hosts, readings)
    if problems:
        raise PreflightError(problems)
