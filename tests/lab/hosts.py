"""Real Debian test hosts: systemd-nspawn containers booted with systemd as PID 1.

A `Lab` owns one private bridge (10.88.0.0/24 by default) and any number of
hosts on it.  Each host is an overlay of the cached rootfs (tests/lab/rootfs.py)
with its own address, host key and authorized key, booted by systemd-nspawn in
a cgroup of its own, and reached over SSH with key-based auth and a known_hosts
file, exactly as from a bastion.  `Lab.close()` removes everything it made
(containers, overlays, cgroups, bridge); it also runs on interpreter exit.

Known constraints of this machine (no systemd as PID 1): nspawn needs
`--register=no --keep-unit`, and each container needs a cgroup of its own under
/sys/fs/cgroup/{systemd,unified}.  /proc/sys stays read-only inside the
containers: making it writable would change this machine's own kernel.
"""

from __future__ import annotations

import atexit
import ipaddress
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.lab.rootfs import SUITE, ensure_rootfs

LAB_NOTES: list[str] = []  # what the session's lab did beyond its tests, shown in the summary (tests/integration/conftest.py)
CGROUP_HIERARCHIES = ("systemd", "unified")
CGROUP_PREFIX = "vp-lab-"
REBOOT_POLL_TIMEOUT_S = 20  # one "are you back?" ssh while a host reboots
NSPAWN_REBOOT_EXIT = 133  # systemd-nspawn's exit status when the container asked to reboot

# The supervisor keeps a host "powered": it restarts nspawn when the container
# reboots, and exits when the container powers off or is killed.
SUPERVISOR = r"""
for hierarchy in {hierarchies}; do echo $$ > /sys/fs/cgroup/$hierarchy/{cgroup}/cgroup.procs; done
while true; do
  systemd-nspawn --quiet --boot --register=no --keep-unit --console=read-only \
    --machine={machine} --directory={root} --network-bridge={bridge}{binds}{options}
  status=$?
  [ "$status" -eq {reboot_exit} ] || exit "$status"
  echo "--- reboot ---"
done
"""


# what ssh says when the connection, or its banner exchange, took longer than ConnectTimeout
SSH_CONNECT_TIMED_OUT = "Connection timed out"


def _run(*command: str, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(command, check=check, capture_output=True, text=True, **kwargs)


@dataclass
class TestHost:
    """One booted test host, reachable over SSH from this machine."""

    name: str
    address: str
    ssh_key: Path
    known_hosts: Path
    base: Path  # upper/, work/, root/ (the merged overlay), console.log
    bridge: str = "vplab0"
    supervisor: subprocess.Popen | None = field(default=None, repr=False)
    ssh_port: int = 22
    binds: tuple[str, ...] = ()  # folders of this machine shown read-only at the same path on the host
    kind: "HostKind | None" = None  # None: a bookworm host as every other

    __test__ = False  # not a pytest test class

    @property
    def root(self) -> Path:
        return self.base / "root"

    @property
    def cgroup(self) -> str:
        return f"{CGROUP_PREFIX}{self.bridge}-{self.name}"

    def ssh_command(self, *remote: str) -> list[str]:
        return [
            "ssh",
            "-p", str(self.ssh_port),
            "-i", str(self.ssh_key),
            "-o", f"UserKnownHostsFile={self.known_hosts}",
            "-o", "StrictHostKeyChecking=yes",
            "-o", "BatchMode=yes",
            "-o", "ConnectTimeout=2",
            "-o", "LogLevel=ERROR",
            f"root@{self.address}",
            *remote,
        ]

    def ssh(self, command: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        """Run a shell command on the host as root; raise with its output when it fails. A connection
        that timed out before the command ran (ssh's 2 s ConnectTimeout, which covers the banner exchange
        too: an emulated VM on a loaded machine can miss it) is tried again, twice at most."""
        for attempt in range(3):
            result = subprocess.run(
                self.ssh_command(command), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout
            )
            if not (result.returncode == 255 and SSH_CONNECT_TIMED_OUT in result.stderr):
                break
            time.sleep(1)
        if check and result.returncode != 0:
            raise RuntimeError(
                f"{self.name}: `{command}` exited {result.returncode}\n"
                f"stdout: {result.stdout[-2000:]}\nstderr: {result.stderr[-2000:]}"
            )
        return result

    def put(self, local: Path, remote: str, mode: str = "0755") -> None:
        """Copy a file from the bastion to the host over SSH."""
        data = Path(local).read_bytes()
        command = f"install -D -m {mode} /dev/stdin {remote}"
        result = subprocess.run(self.ssh_command(command), input=data, capture_output=True, timeout=60)
        if result.returncode != 0:
            raise RuntimeError(f"{self.name}: copying {local} to {remote} failed: {result.stderr!r}")

    def wait_for_ssh(self, timeout: float = 60) -> float:
        """Block until SSH answers and systemd finished booting; return the seconds waited."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if self.supervisor is not None and self.supervisor.poll() is not None:
                raise RuntimeError(f"{self.name}: exited early\n{self.console_tail()}")
            result = subprocess.run(
                self.ssh_command("systemctl is-system-running --wait"),
                stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout,
            )
            if result.returncode != 255:  # 255: ssh itself failed (not up yet)
                return time.monotonic() - started
            time.sleep(0.1)
        raise TimeoutError(f"{self.name}: no SSH after {timeout}s\n{self.console_tail()}")

    def reboot(self, timeout: float = 60) -> float:
        """Reboot the host in place (its disk is kept); return seconds until SSH answers again."""
        boot_id = self.ssh("cat /proc/sys/kernel/random/boot_id").stdout.strip()
        started = time.monotonic()
        self.ssh("systemctl reboot", check=False)
        while time.monotonic() - started < timeout:
            time.sleep(0.2)
            try:  # a connection made while the host shuts down can hang for good (qemu's user network)
                result = subprocess.run(
                    self.ssh_command("cat /proc/sys/kernel/random/boot_id"), stdin=subprocess.DEVNULL,
                    capture_output=True, text=True,
                    timeout=REBOOT_POLL_TIMEOUT_S,
                )
            except subprocess.TimeoutExpired:
                continue
            if result.returncode == 0 and result.stdout.strip() != boot_id:
                self.wait_for_ssh(timeout)
                return time.monotonic() - started
        raise TimeoutError(f"{self.name}: did not come back within {timeout}s\n{self.console_tail()}")

    def console_tail(self, lines: int = 30) -> str:
        log = self.base / "console.log"
        if not log.exists():
            return "(no console log)"
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


class HostKind:
    """A kind of test host other than the default bookworm one: its suite, and what booting it needs."""

    suite: str

    def prepare(self, host: TestHost) -> None:
        """Write what the host needs into its root (an overlay, before it boots)."""

    def nspawn_options(self, host: TestHost) -> list[str]:
        return []

    def nspawn_environment(self) -> dict[str, str]:
        return {}


class Lab:
    """A private bridge and the test hosts on it; close() tears all of it down."""

    def __init__(
        self,
        bridge: str | None = None,
        network: str | None = None,
        workdir: Path | None = None,
    ) -> None:
        # VP_LAB_BRIDGE / VP_LAB_NETWORK let two labs run side by side (e.g. 10.88.2.0/24)
        self.bridge = bridge or os.environ.get("VP_LAB_BRIDGE", "vplab0")
        self.network = ipaddress.ip_network(network or os.environ.get("VP_LAB_NETWORK", "10.88.0.0/24"))
        self.gateway = str(next(self.network.hosts()))
        self.removed_stale = self._claim_bridge()
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix=f"vp-lab-{self.bridge}-", dir="/var/tmp"))
        self.hosts: list[TestHost] = []
        self._next_index = 0  # addresses are never reused: known_hosts keeps old keys
        self.rootfs, self.rootfs_seconds, self.rootfs_built = ensure_rootfs()
        self._rootfs_by_suite = {SUITE: self.rootfs}
        self.ssh_key = self.workdir / "bastion_key"
        self.known_hosts = self.workdir / "known_hosts"
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "vp-lab-bastion", "-f", str(self.ssh_key))
        self.known_hosts.write_text("")
        self._closed = False
        self._create_bridge()
        atexit.register(self.close)

    # -- network --------------------------------------------------------------
    def _claim_bridge(self) -> list[str]:
        """Own the bridge name: a live lab's bridge is refused, a dead lab's leftovers are removed."""
        owner = lab_owner(self.bridge)
        if owner is not None and owner.alive():
            raise RuntimeError(
                f"bridge {self.bridge} belongs to a running lab (pid {owner.pid}): "
                "set VP_LAB_BRIDGE and VP_LAB_NETWORK to run another one beside it"
            )
        removed = cleanup_stale(self.bridge)
        OWNER_DIR.mkdir(parents=True, exist_ok=True)
        LabOwner.current().write(OWNER_DIR / f"{self.bridge}.pid")
        return removed

    def _create_bridge(self) -> None:
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "addr", "add", f"{self.gateway}/{self.network.prefixlen}", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")

    @property
    def boot_count(self) -> int:
        """How many hosts this lab has booted so far (addresses handed out)."""
        return self._next_index

    def _next_address(self) -> str:
        address = self.network.network_address + 10 + self._next_index
        if address not in self.network or address == self.network.broadcast_address:
            raise RuntimeError(f"{self.network} has no address left for another test host")
        self._next_index += 1
        return str(address)

    # -- hosts ----------------------------------------------------------------
    def boot(self, name: str, binds: tuple[str, ...] = (), kind: HostKind | None = None) -> TestHost:
        """Create and boot one host; returns once SSH answers and boot finished."""
        return self.boot_many([name], binds, kind)[0]

    def boot_many(self, names: list[str], binds: tuple[str, ...] = (), kind: HostKind | None = None) -> list[TestHost]:
        """Boot several hosts in parallel (their boots overlap); `binds`: folders of this machine each
        host sees read-only at the same path; `kind`: another suite and setup (default: bookworm)."""
        hosts = []
        for name in names:
            if any(h.name == name for h in self.hosts):
                raise ValueError(f"host {name} already exists in this lab")
            host = TestHost(
                name=name,
                address=self._next_address(),
                ssh_key=self.ssh_key,
                known_hosts=self.known_hosts,
                base=self.workdir / "hosts" / name,
                bridge=self.bridge,
                binds=tuple(binds),
                kind=kind,
            )
            self.hosts.append(host)
            self._prepare_disk(host)
            if kind is not None:
                kind.prepare(host)
            self._power_on(host)
            hosts.append(host)
        for host in hosts:
            host.wait_for_ssh()
        return hosts

    def _prepare_disk(self, host: TestHost) -> None:
        for sub in ("upper", "work", "root"):
            (host.base / sub).mkdir(parents=True, exist_ok=True)
        suite = host.kind.suite if host.kind else SUITE
        if suite not in self._rootfs_by_suite:
            self._rootfs_by_suite[suite] = ensure_rootfs(suite)[0]
        _run(
            "mount", "-t", "overlay", "overlay", "-o",
            f"lowerdir={self._rootfs_by_suite[suite]},upperdir={host.base / 'upper'},workdir={host.base / 'work'}",
            str(host.root),
        )
        root = host.root
        (root / "etc/hostname").write_text(host.name + "\n")
        # nothing outside the lab: mmdebstrap leaves this machine's mirror in the rootfs's apt sources
        # (sources.list.d/0000<its target>.sources) and its name server in resolv.conf, neither of which a
        # lab host can reach (an apt-get update waited minutes on them)
        for sources in (root / "etc/apt/sources.list.d").glob("0000*.sources"):
            sources.unlink()
        resolv = root / "etc/resolv.conf"
        resolv.unlink(missing_ok=True)
        resolv.write_text("# vllm-provision lab: no name server (hosts are reached by address)\n")
        network = root / "etc/systemd/network/10-host0.network"
        network.parent.mkdir(parents=True, exist_ok=True)
        network.write_text(
            "[Match]\nName=host0\n\n[Network]\n"
            f"Address={host.address}/{self.network.prefixlen}\nGateway={self.gateway}\n"
            "LinkLocalAddressing=no\n"
        )
        wants = root / "etc/systemd/system/multi-user.target.wants/systemd-networkd.service"
        wants.unlink(missing_ok=True)
        wants.symlink_to("/lib/systemd/system/systemd-networkd.service")
        # each host gets its own host key, recorded in the bastion's known_hosts
        for old in (root / "etc/ssh").glob("ssh_host_*"):
            old.unlink()
        host_key = root / "etc/ssh/ssh_host_ed25519_key"
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{host.name}", "-f", str(host_key))
        public = (root / "etc/ssh/ssh_host_ed25519_key.pub").read_text().split()
        with self.known_hosts.open("a") as known:
            known.write(f"{host.address} {public[0]} {public[1]}\n")
        ssh_dir = root / "root/.ssh"
        ssh_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        (ssh_dir / "authorized_keys").write_text(Path(str(self.ssh_key) + ".pub").read_text())
        (ssh_dir / "authorized_keys").chmod(0o600)

    def _power_on(self, host: TestHost) -> None:
        for hierarchy in CGROUP_HIERARCHIES:
            Path(f"/sys/fs/cgroup/{hierarchy}/{host.cgroup}").mkdir(exist_ok=True)
        script = SUPERVISOR.format(
            hierarchies=" ".join(CGROUP_HIERARCHIES),
            cgroup=host.cgroup,
            # the host-side veth is named after the machine (vb-<machine>): unique per lab
            machine=f"{self.bridge[2:]}{host.name}",
            root=host.root,
            bridge=self.bridge,
            binds="".join(f" --bind-ro={shlex.quote(path)}" for path in host.binds),
            options="".join(f" {shlex.quote(option)}" for option in (host.kind.nspawn_options(host) if host.kind else [])),
            reboot_exit=NSPAWN_REBOOT_EXIT,
        )
        console = open(host.base / "console.log", "ab")
        host.supervisor = subprocess.Popen(
            ["bash", "-c", script],
            env={**os.environ, **(host.kind.nspawn_environment() if host.kind else {})},
            stdin=subprocess.DEVNULL,
            stdout=console,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        console.close()

    def power_off(self, host: TestHost) -> None:
        """Stop a host's container (a hard power-off) and wait until it is gone."""
        if host.supervisor is not None and host.supervisor.poll() is None:
            try:
                os.killpg(host.supervisor.pid, signal.SIGTERM)  # nspawn powers the container off
            except ProcessLookupError:
                pass
            try:
                host.supervisor.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(host.supervisor.pid, signal.SIGKILL)
                host.supervisor.wait(timeout=10)
        _kill_cgroup(host.cgroup)

    def power_on(self, host: TestHost, timeout: float = 60) -> float:
        """Boot a host that power_off stopped, its disk as it was; return the seconds until SSH answers."""
        self._power_on(host)
        return host.wait_for_ssh(timeout)

    def set_link(self, host: TestHost, up: bool) -> None:
        """Take the host's link down (it goes silent, as with a pulled cable: no packet in or out, no
        reset; a new connection finds no route) or bring it back up: the bridge side of its veth."""
        _run("ip", "link", "set", f"vb-{self.bridge[2:]}{host.name}", "up" if up else "down")

    def destroy(self, host: TestHost) -> None:
        """Power a host off and remove its disk, cgroups and link (a veth whose container namespace the kernel
        is slow to free, as after its link was taken down with connections open, would stop a later host
        of the same name from booting)."""
        self.power_off(host)
        subprocess.run(["ip", "link", "del", f"vb-{self.bridge[2:]}{host.name}"], capture_output=True)
        subprocess.run(["umount", "-l", str(host.root)], capture_output=True)
        _remove_cgroup(host.cgroup)
        shutil.rmtree(host.base, ignore_errors=True)
        self.hosts.remove(host)

    # -- teardown -------------------------------------------------------------
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for host in list(self.hosts):
            self.destroy(host)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
        shutil.rmtree(self.workdir, ignore_errors=True)
        (OWNER_DIR / f"{self.bridge}.pid").unlink(missing_ok=True)

    def __enter__(self) -> "Lab":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _cgroup_dirs(cgroup: str) -> list[Path]:
    """Every directory of a host's cgroup trees, deepest first (tolerates vanishing children)."""
    dirs = []
    for hierarchy in CGROUP_HIERARCHIES:
        for current, _subdirs, _files in os.walk(f"/sys/fs/cgroup/{hierarchy}/{cgroup}", onerror=lambda e: None):
            dirs.append(Path(current))
    return sorted(dirs, key=lambda p: -len(p.parts))


def _cgroup_pids(cgroup: str) -> set[int]:
    pids: set[int] = set()
    for directory in _cgroup_dirs(cgroup):
        try:
            pids.update(int(p) for p in (directory / "cgroup.procs").read_text().split())
        except OSError:
            pass
    return pids


def _kill_cgroup(cgroup: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while (pids := _cgroup_pids(cgroup)) and time.monotonic() < deadline:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)


def _remove_cgroup(cgroup: str) -> None:
    for directory in _cgroup_dirs(cgroup):
        try:
            directory.rmdir()
        except OSError:
            pass


OWNER_DIR = Path("/run/vp-lab")


@dataclass(frozen=True)
class LabOwner:
    """The process that owns a lab's bridge, told apart from a later process with a reused pid."""

    pid: int
    start_time: str

    @staticmethod
    def start_time_of(pid: int) -> str | None:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return None
        return stat.rsplit(")", 1)[1].split()[19]  # field 22: start time in clock ticks since boot

    @classmethod
    def current(cls) -> "LabOwner":
        return cls(os.getpid(), cls.start_time_of(os.getpid()) or "")

    def alive(self) -> bool:
        return self.start_time_of(self.pid) == self.start_time

    def write(self, path: Path) -> None:
        path.write_text(f"{self.pid} {self.start_time}\n")


def lab_owner(bridge: str) -> LabOwner | None:
    try:
        pid, start_time = (OWNER_DIR / f"{bridge}.pid").read_text().split()
    except (OSError, ValueError):
        return None
    return LabOwner(int(pid), start_time)


def cleanup_stale(bridge: str | None = None) -> list[str]:
    """Remove what a killed lab left behind: its containers, overlays, cgroups and bridge."""
    bridge = bridge or os.environ.get("VP_LAB_BRIDGE", "vplab0")
    removed = []
    for hierarchy in CGROUP_HIERARCHIES:
        for top in Path(f"/sys/fs/cgroup/{hierarchy}").glob(f"{CGROUP_PREFIX}{bridge}-*"):
            _kill_cgroup(top.name)
            _remove_cgroup(top.name)
            removed.append(f"cgroup {top.name}")
    for line in Path("/proc/mounts").read_text().splitlines():
        target = line.split()[1]
        if target.startswith(f"/var/tmp/vp-lab-{bridge}-") and target.endswith("/root"):
            subprocess.run(["umount", "-l", target], capture_output=True)
            removed.append(f"mount {target}")
    for workdir in Path("/var/tmp").glob(f"vp-lab-{bridge}-*"):
        shutil.rmtree(workdir, ignore_errors=True)
        removed.append(f"workdir {workdir}")
    if Path(f"/sys/class/net/{bridge}").exists():
        subprocess.run(["ip", "link", "del", bridge], capture_output=True)
        removed.append(f"bridge {bridge}")
    (OWNER_DIR / f"{bridge}.pid").unlink(missing_ok=True)
    return removed
