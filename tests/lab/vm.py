"""A real-kernel test host: a qemu virtual machine booting Debian bookworm's own kernel through GRUB.

Containers share this machine's kernel, so live sysctls, kernel modules, the initramfs, the kernel
command line and a real reboot can only be proven in a virtual machine.

The disk image is built once and cached (zstd, keyed on everything that goes into it):

1. mmdebstrap: the nspawn hosts' packages (tests/lab/rootfs.py) plus Debian's kernel, initramfs-tools
   and GRUB, from this machine's own apt sources, and Debian's own NVIDIA driver 535 (the compute set role
   nvidia_driver installs with source distribution, from the lab's cached repository of Debian's driver
   packages: tests/lab/nvidia_driver.py) with the kernel's headers: DKMS builds its module here, natively,
   for the image's kernel (in a chroot it builds for every kernel in /lib/modules), never under emulation;
   nvidia-persistenced is masked (no GPU: it would fail every boot); customize hooks write fstab, DHCP
   networking, a serial console for GRUB and the kernel, root's authorized key and the host key, and
   fail the build unless the module was built;
2. `mkfs.ext4 -d` turns the tree into the root filesystem of a one-partition MBR disk (no loop
   device, no mount);
3. a first boot straight into that kernel (qemu -kernel) runs `grub-install /dev/vda` and
   `update-grub` inside the machine itself, then sets MODULES=dep for later initramfs builds
   (Debian's MODULES=most takes ~10 min per `update-initramfs` under emulation).

Each test machine boots a copy-on-write qcow2 overlay of the cached image through SeaBIOS and GRUB,
with user-mode networking (`restrict=on`: the guest reaches nothing outside) and SSH forwarded to a
free port on 127.0.0.1. KVM is used only when a probe boot under it reaches SSH; on this kind of
machine /dev/kvm is a software hypervisor on which Debian's kernel faults, so qemu's own emulation
(TCG) runs the machine. VP_VM_ACCEL=kvm|tcg skips the probe.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.lab.hosts import TestHost
from tests.lab.nvidia_driver import debian_driver_repo, debian_set
from tests.lab.rootfs import APT_SOURCES, PACKAGES, SUITE, cache_dir

KERNEL_PACKAGES = ("linux-image-amd64", "initramfs-tools", "grub-pc", "udev", "e2fsprogs", "zstd")
VM_TIMINGS: dict[str, float | str] = {}  # what a test run measured; pytest prints it at the end
IMAGE_RECIPE = 2  # bump when the build steps below change: a new cache key
DRIVER_BRANCH = "535"  # Debian bookworm's driver the image carries, built by DKMS (role nvidia_driver's set)
DRIVER_MODULE = "nvidia-current"  # Debian's name for it (nvidia-kernel-support maps `modprobe nvidia` to it)
DISK_SIZE_MIB = 6144
PARTITION_START_MIB = 1
MEMORY_MIB = 3072
GRUB_DEFAULTS = (
    'GRUB_TIMEOUT=0\n'
    'GRUB_TERMINAL=serial\n'
    'GRUB_SERIAL_COMMAND="serial --unit=0 --speed=115200"\n'
    'GRUB_CMDLINE_LINUX_DEFAULT="console=ttyS0,115200"\n'
)
NETWORK = "[Match]\nName=en*\n\n[Network]\nDHCP=ipv4\nLinkLocalAddressing=no\n"


def image_key() -> str:
    material = "\n".join([SUITE, *PACKAGES, *KERNEL_PACKAGES, *debian_set(DRIVER_BRANCH), debian_driver_repo().name,
                          str(IMAGE_RECIPE), APT_SOURCES.read_text()])
    return hashlib.sha256(material.encode()).hexdigest()[:16]


@dataclass
class Image:
    """A cached VM disk image and the SSH identities baked into it."""

    disk: Path  # raw disk, read-only base of every test machine's overlay
    kernel: Path  # the image's kernel and first initramfs, for direct boots (build, KVM probe)
    initrd: Path
    ssh_key: Path  # the bastion's private key, authorized for root in the image
    host_public_key: str  # "ssh-ed25519 AAAA…" of the image's host key
    seconds: float = 0.0
    built: bool = False


def ensure_image() -> Image:
    """The cached image, built when missing (cold: mmdebstrap + first boot; cached: unpacked once)."""
    started = time.monotonic()
    base = cache_dir() / f"vm-{SUITE}-{image_key()}"
    packed = base.with_name(base.name + ".img.zst")
    built = False
    if not packed.exists():
        _build(base, packed)
        built = True
    disk = base / "disk.raw"
    if not disk.exists():
        partial = disk.with_suffix(".partial")
        subprocess.run(["zstd", "-q", "-d", "-f", "--sparse", str(packed), "-o", str(partial)], check=True)
        partial.rename(disk)
    return Image(
        disk=disk,
        kernel=base / "vmlinuz",
        initrd=base / "initrd.img",
        ssh_key=base / "bastion_key",
        host_public_key=" ".join((base / "ssh_host_ed25519_key.pub").read_text().split()[:2]),
        seconds=time.monotonic() - started,
        built=built,
    )


def _build(base: Path, packed: Path) -> None:
    if base.exists():
        shutil.rmtree(base)
    base.mkdir(parents=True)
    _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "vp-vm-bastion", "-f", str(base / "bastion_key"))
    _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "root@vp-vm", "-f", str(base / "ssh_host_ed25519_key"))
    with tempfile.TemporaryDirectory(prefix="vp-vm-build-", dir="/var/tmp") as scratch:
        tree = Path(scratch) / "tree"
        _mmdebstrap(tree, base)
        shutil.copy(max(tree.glob("boot/vmlinuz-*")), base / "vmlinuz")
        shutil.copy(max(tree.glob("boot/initrd.img-*")), base / "initrd.img")
        disk = base / "disk.raw"
        _make_disk(tree, disk)
    _install_grub(base, disk)
    partial = packed.with_name(packed.name + ".partial")
    _run("zstd", "-q", "-T0", "-f", str(disk), "-o", str(partial))
    partial.rename(packed)


def _mmdebstrap(tree: Path, base: Path) -> None:
    authorized = (base / "bastion_key.pub").read_text()
    hooks = [
        'echo vp-vm > "$1/etc/hostname"',
        'echo "LABEL=vproot / ext4 errors=remount-ro 0 1" > "$1/etc/fstab"',
        f"printf '%s' '{NETWORK}' > \"$1/etc/systemd/network/10-dhcp.network\"",
        'ln -sf /lib/systemd/system/systemd-networkd.service '
        '"$1/etc/systemd/system/multi-user.target.wants/systemd-networkd.service"',
        f"printf '%s' '{GRUB_DEFAULTS}' >> \"$1/etc/default/grub\"",
        'rm -f "$1"/etc/ssh/ssh_host_*',
        f'install -m 0600 {base}/ssh_host_ed25519_key "$1/etc/ssh/ssh_host_ed25519_key"',
        f'install -m 0644 {base}/ssh_host_ed25519_key.pub "$1/etc/ssh/ssh_host_ed25519_key.pub"',
        'install -d -m 0700 "$1/root/.ssh"',
        f"printf '%s' '{authorized}' > \"$1/root/.ssh/authorized_keys\"",
        'chmod 0600 "$1/root/.ssh/authorized_keys"',
        # no GPU in the machine: the daemon would fail every boot (a masked unit is one the GPU role leaves)
        'ln -sf /dev/null "$1/etc/systemd/system/nvidia-persistenced.service"',
        # DKMS built the driver's module for the image's kernel, or the build fails here
        f'ls "$1"/lib/modules/*/updates/dkms/{DRIVER_MODULE}.ko',
        # the driver repository was for the build only: the machine's apt knows Debian's mirror alone
        'for f in "$1/etc/apt/sources.list" "$1"/etc/apt/sources.list.d/*.list; do [ ! -f "$f" ] || sed -i "/file:/d" "$f"; done',
    ]
    command = [
        "mmdebstrap", "--quiet", "--variant=minbase",
        "--include=" + ",".join((*PACKAGES, *KERNEL_PACKAGES, *debian_set(DRIVER_BRANCH))),
        "--hook-dir=/usr/share/mmdebstrap/hooks/file-mirror-automount",
        *(f"--customize-hook={hook}" for hook in hooks),
        SUITE, str(tree), str(APT_SOURCES), f"deb [trusted=yes] file://{debian_driver_repo()} ./",
    ]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"mmdebstrap failed ({result.returncode}):\n{result.stderr[-4000:]}")


def _make_disk(tree: Path, disk: Path) -> None:
    """A sparse raw disk: an MBR table with one bootable Linux partition holding `tree` as ext4."""
    with disk.open("wb") as handle:
        handle.truncate(DISK_SIZE_MIB << 20)
    _run("sfdisk", "--quiet", str(disk), input=f"start={PARTITION_START_MIB}MiB, type=83, bootable\n")
    size_kib = (DISK_SIZE_MIB - PARTITION_START_MIB) << 10
    _run("mkfs.ext4", "-q", "-F", "-L", "vproot", "-d", str(tree),
         "-E", f"offset={PARTITION_START_MIB << 20}", str(disk), f"{size_kib}k")


def _install_grub(base: Path, disk: Path) -> None:
    """First boot, straight into the kernel: GRUB is installed by the machine itself."""
    image = Image(disk=disk, kernel=base / "vmlinuz", initrd=base / "initrd.img", ssh_key=base / "bastion_key",
                  host_public_key=" ".join((base / "ssh_host_ed25519_key.pub").read_text().split()[:2]))
    machine = VirtualMachine.start(image, workdir=base / "first-boot", accel=accelerator(image),
                                   direct_boot=True, writable_base=True)
    try:
        machine.wait_for_ssh(timeout=600)
        machine.ssh("grub-install /dev/vda && update-grub", timeout=600)
        # later initramfs builds hold only the modules this machine needs (virtio), ~70 s instead of ~10 min
        machine.ssh("echo MODULES=dep > /etc/initramfs-tools/conf.d/vp-lab-modules")
        machine.power_off()
    finally:
        machine.stop()
        shutil.rmtree(base / "first-boot", ignore_errors=True)


# -- accelerator ------------------------------------------------------------------------------
_ACCEL: str | None = None


def accelerator(image: Image) -> str:
    """'kvm' when a probe boot under KVM reaches SSH, else 'tcg' (VP_VM_ACCEL overrides); probed once."""
    global _ACCEL
    if _ACCEL is None:
        _ACCEL = os.environ.get("VP_VM_ACCEL") or _probe_kvm(image)
    return _ACCEL


def _probe_kvm(image: Image) -> str:
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return "tcg"
    with tempfile.TemporaryDirectory(prefix="vp-vm-probe-", dir="/var/tmp") as scratch:
        probe = VirtualMachine.start(image, workdir=Path(scratch), accel="kvm", direct_boot=True,
                                     extra_cmdline="panic=-1 oops=panic")
        try:
            probe.wait_for_ssh(timeout=60)
            return "kvm"
        except (RuntimeError, TimeoutError):
            return "tcg"
        finally:
            probe.stop()


# -- a running machine ------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class VirtualMachine(TestHost):
    """One qemu machine, reached over SSH on 127.0.0.1:ssh_port; its disk is an overlay of the image."""

    accel: str = "tcg"
    command: list[str] = field(default_factory=list, repr=False)

    __test__ = False

    @classmethod
    def start(cls, image: Image, workdir: Path, accel: str, name: str = "vm", direct_boot: bool = False,
              writable_base: bool = False, extra_cmdline: str = "") -> "VirtualMachine":
        """Create the overlay and known_hosts in `workdir`, and power the machine on."""
        workdir.mkdir(parents=True, exist_ok=True)
        port = _free_port()
        known_hosts = workdir / "known_hosts"
        known_hosts.write_text(f"[127.0.0.1]:{port} {image.host_public_key}\n")
        if writable_base:
            drive = f"file={image.disk},if=virtio,format=raw,cache=unsafe"
        else:
            overlay = workdir / "disk.qcow2"
            _run("qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", str(image.disk), str(overlay))
            drive = f"file={overlay},if=virtio,format=qcow2,cache=unsafe"
        # qemu64 (x86-64 baseline, all bookworm needs): under TCG ~1.5x faster than -cpu max, whose
        # AVX paths qemu emulates in helpers (python3 start-up 1.04 s vs 1.16 s, sha256 1.1 s vs 1.8 s)
        cpu = "host" if accel == "kvm" else "qemu64"
        command = [
            "qemu-system-x86_64", "-name", name, "-nodefaults", "-display", "none",
            "-accel", "kvm" if accel == "kvm" else "tcg,thread=multi", "-cpu", cpu,
            "-smp", str(os.cpu_count() or 1), "-m", str(MEMORY_MIB),
            "-drive", drive,
            "-netdev", f"user,id=net0,restrict=on,hostfwd=tcp:127.0.0.1:{port}-:22",
            "-device", "virtio-net-pci,netdev=net0,romfile=",  # no network boot ROM (iPXE) needed
            "-serial", f"file:{workdir / 'console.log'}",
        ]
        if direct_boot:
            command += ["-kernel", str(image.kernel), "-initrd", str(image.initrd), "-no-reboot",
                        "-append", f"root=/dev/vda1 rw console=ttyS0,115200 {extra_cmdline}".strip()]
        machine = cls(name=name, address="127.0.0.1", ssh_key=image.ssh_key, known_hosts=known_hosts,
                      base=workdir, ssh_port=port, accel=accel, command=command)
        machine.power_on()
        return machine

    def power_on(self) -> None:
        log = open(self.base / "qemu.log", "ab")
        self.supervisor = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=log,
                                           stderr=subprocess.STDOUT, start_new_session=True)
        log.close()

    def power_off(self, timeout: float = 120) -> None:
        """A clean shutdown from inside; returns once qemu has exited."""
        self.ssh("systemctl poweroff", check=False)
        try:
            self.supervisor.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"{self.name}: still running {timeout}s after poweroff\n{self.console_tail()}")

    def console_tail(self, lines: int = 30) -> str:
        qemu_log = (self.base / "qemu.log").read_text(errors="replace").strip() if (self.base / "qemu.log").exists() else ""
        return super().console_tail(lines) + (f"\nqemu: {qemu_log[-2000:]}" if qemu_log else "")

    def stop(self) -> None:
        """Pull the plug (no-op when qemu has already exited)."""
        if self.supervisor is not None and self.supervisor.poll() is None:
            os.killpg(self.supervisor.pid, signal.SIGKILL)
            self.supervisor.wait(timeout=10)


def _run(*command: str, input: str | None = None) -> subprocess.CompletedProcess:
    result = subprocess.run(command, capture_output=True, text=True, input=input)
    if result.returncode != 0:
        raise RuntimeError(f"`{' '.join(command)}` exited {result.returncode}: {result.stderr[-2000:]}")
    return result
