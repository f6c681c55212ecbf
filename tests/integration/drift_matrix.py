"""The drift matrix: every drift the audit must catch, planted alone on an applied lab host.

One table, read by tests/integration/test_drift_matrix.py (which plants each entry in turn on one
host) and by the docs (docs/drift-matrix.md is generated from it: tests/unit/test_docs.py keeps it
current; regenerate with `python -m tests.integration.drift_matrix > docs/drift-matrix.md`).

An entry (Drift):
  name     what someone did to the host, in a few words
  plant    the shell command that does it (run as root on the host)
  rows     exactly the audit rows that fail afterwards: {check: (expected, actual)}; nothing else may
           fail. Values may hold {address}, {uuid} (the host's stand-in GPU UUID) and {unit}.
  repair   what the next apply does about it, in words (the docs' last column)
  tags     the roles whose run repairs it (apply --tags); () runs the whole site
  refused  None: the next apply repairs it. A text: the next apply stops instead, and its error
           holds this text (the fix); `fix` is then what the user runs, after which apply succeeds.
  twice    a second apply of the same roles after the repair changes nothing (asserted where set)
  heals_by_itself  systemd repairs it on its own (a unit restarting its killed server): the audit
           passes again within a minute, and the next apply finds nothing to change.

The host's spec: one venv instance `chat` (port 8000, an API key from a file, GPU 0 at 0.9), the
stand-in nvidia-smi's RTX 3090, swappiness 1, vm.max_map_count, /dev/shm 1G, nouveau blacklisted.
"""

from __future__ import annotations

from dataclasses import dataclass

from provisioner.base.paths import role_dir
from tests.doubles.nvidia_smi_standin import FAIL_AT_BOOT

UNIT = "vllm-chat.service"
# the boot-time drifts of /dev/shm and nouveau (issue 35, point 4): what decides them at the next boot
OUR_FSTAB_LINE = "tmpfs /dev/shm tmpfs defaults,nosuid,nodev,size=1G 0 0"
OTHER_FSTAB_LINE = "tmpfs /dev/shm tmpfs defaults,size=128M 0 0"
SHM_DROPIN = "/etc/systemd/system/dev-shm.mount.d/size.conf"
NOUVEAU_FLAGS = "nouveau.modeset=0 rd.driver.blacklist=nouveau modprobe.blacklist=nouveau"
NOUVEAU_GRUB = "nouveau on the kernel command line GRUB builds"
NOT_OURS = "it is not vllm-provision's file to change"
SYSCTL_FILE = "/etc/sysctl.d/60-vllm-provision.conf"
UNIT_FILE = f"/etc/systemd/system/{UNIT}"
RELOAD_AND_RESTART = f"systemctl daemon-reload && systemctl restart {UNIT}"
OWN_DROPIN_DIR = f"/etc/systemd/system/{UNIT}.d"
OWN_DROPIN = f"{OWN_DROPIN_DIR}/override.conf"
SHARED_DROPIN = "/etc/systemd/system/vllm-.service.d/gpu.conf"
COMMAND_LINE = "/opt/vllm/venvs/0.25.0/bin/vllm serve --config /etc/vllm/chat.yaml"
# helper C2's section: the GPU boot unit, the venv's vLLM, managed files
GPU_BOOT_UNIT = "nvidia-gpu-limits.service"
GPU_SCRIPT = "/usr/local/lib/vllm-provision/nvidia-gpu-limits"
GPU_SETTINGS = "/etc/vllm-provision/nvidia-gpu-limits.conf"
WAIT_READY = "/usr/local/lib/vllm-provision/wait-ready"
GPU_SCRIPT_LINES = len((role_dir("nvidia_gpu") / "files" / "nvidia-gpu-limits").read_text(encoding="utf-8").splitlines())
WAIT_READY_LINES = len((role_dir("vllm_service") / "files" / "wait-ready").read_text(encoding="utf-8").splitlines())
# a second version of the TEST DOUBLE vLLM: its wheel must be on the host before the plants
# (test_drift_matrix.py puts it there)
OTHER_VLLM_VERSION = "0.33.0"
OTHER_VLLM_WHEEL = f"/root/vllm-{OTHER_VLLM_VERSION}-py3-none-any.whl"
# what also fails whenever the instance's server is not running
SERVER_DOWN = {
    f"{UNIT}: listening": ("{address}:8000", "nothing on port 8000"),
    f"{UNIT}: GET http://{{address}}:8000/health": ("200", "{address}: connect: Connection refused"),
    f"{UNIT}: GET http://{{address}}:8000/v1/models": ("Qwen/Qwen3-1.7B", "{address}: connect: Connection refused"
                                                                          " (key: the spec's api_key_file)"),
    f"{UNIT}: ready (one request served)": ("ready", "http://{address}:8000 (Qwen/Qwen3-1.7B) not ready (last: [Errno 111]"
                                                     " Connection refused)"),
    f"{UNIT}: restart pending": ("none: the process started after its files changed",
                                 "no running server to compare with its files"),
    f"{UNIT}: vLLM running": ("0.25.0", "no running server"),
}
# the restart pending rows: times and pids as test_drift_matrix.py shows them (TIME, PID)
RESTART_PENDING = f"{UNIT}: restart pending"
NO_RESTART = "none: the process started after its files changed"


@dataclass(frozen=True)
class Drift:
    name: str
    plant: str
    rows: dict[str, tuple[str, str]]
    repair: str
    tags: tuple[str, ...] = ()
    refused: str | None = None
    fix: str = ""
    heals_by_itself: bool = False  # systemd repairs it before any apply could (a killed server's unit restarts it)
    twice: bool = False  # a second apply after the repair is asserted to change nothing

    def expected_rows(self, **context: str) -> dict[str, tuple[str, str]]:
        return {check.format(**context): (expected.format(**context), actual.format(**context))
                for check, (expected, actual) in self.rows.items()}


DRIFTS: list[Drift] = [
    # ------------------------------------------------------------------ sysctl (role sysctl)
    Drift("our sysctl file edited",
          "sed -i 's/^vm.swappiness = 1$/vm.swappiness = 60/' /etc/sysctl.d/60-vllm-provision.conf",
          {"sysctl at boot: vm.swappiness": (f"1 ({SYSCTL_FILE})", f"60 ({SYSCTL_FILE})")},
          "rewrites the file", tags=("sysctl",)),
    # ------------------------------------------------------------------ /dev/shm (role shm)
    Drift("/dev/shm remounted smaller",
          "mount -o remount,size=512M /dev/shm",
          {"/dev/shm size": (f"{1024 ** 3} bytes (1G)", f"{512 * 1024 ** 2} bytes")},
          "remounts it at the spec's size", tags=("shm",)),
    Drift("another /dev/shm line before ours in /etc/fstab (the first decides the size after a reboot)",
          f"sed -i '1i {OTHER_FSTAB_LINE}' /etc/fstab",
          {"/dev/shm in /etc/fstab": (OUR_FSTAB_LINE, f"{OTHER_FSTAB_LINE}, {OUR_FSTAB_LINE}"),
           "/dev/shm size at boot": (f"{1024 ** 3} bytes (1G)",
                                     f"{128 * 1024 ** 2} bytes (/etc/fstab line 1, size=128M)")},
          "keeps our line alone, where the first /dev/shm line was", tags=("shm",), twice=True),
    Drift("another /dev/shm line after ours in /etc/fstab",
          f"echo '{OTHER_FSTAB_LINE}' >> /etc/fstab",
          {"/dev/shm in /etc/fstab": (OUR_FSTAB_LINE, f"{OUR_FSTAB_LINE}, {OTHER_FSTAB_LINE}")},
          "removes the other line", tags=("shm",), twice=True),
    Drift("a dev-shm.mount drop-in sets the mount's options",
          f"mkdir -p {SHM_DROPIN.rsplit('/', 1)[0]} && printf '[Mount]\\nOptions=mode=1777,size=64M\\n' > {SHM_DROPIN}"
          " && systemctl daemon-reload",
          {"/dev/shm mount unit": ("no file that sets dev-shm.mount's options",
                                   f"{SHM_DROPIN} sets Options=mode=1777,size=64M")},
          "stops before changing anything: the drop-in is not the role's", tags=("shm",),
          refused=f"{SHM_DROPIN} sets Options=mode=1777,size=64M for dev-shm.mount", twice=True,
          fix=f"rm -r {SHM_DROPIN.rsplit('/', 1)[0]} && systemctl daemon-reload"),
    # ------------------------------------------------------------------ nouveau at the next boot (role nouveau)
    Drift("another modprobe.d file sets nouveau modeset=1",
          "echo 'options nouveau modeset=1' > /etc/modprobe.d/zz-nouveau-kms.conf",
          {"nouveau modprobe.d: modeset": ("0", "1 (/etc/modprobe.d/zz-nouveau-kms.conf line 1)")},
          "stops before changing anything, naming the file and its line", tags=("nouveau",), twice=True,
          refused=f"/etc/modprobe.d/zz-nouveau-kms.conf decides 'nouveau modprobe.d: modeset' (1 (/etc/modprobe.d/"
                  f"zz-nouveau-kms.conf line 1), expected 0): {NOT_OURS}; remove the line 'options nouveau modeset=1'",
          fix="rm /etc/modprobe.d/zz-nouveau-kms.conf"),
    Drift("nouveau.modeset=1 in /etc/default/grub",
          "echo 'GRUB_CMDLINE_LINUX_DEFAULT=\"quiet nouveau.modeset=1\"' >> /etc/default/grub",
          {NOUVEAU_GRUB: (NOUVEAU_FLAGS,
                          "nouveau.modeset=1 last, from /etc/default/grub line 1 (GRUB_CMDLINE_LINUX_DEFAULT)")},
          "stops before changing anything, naming the file and its line", tags=("nouveau",), twice=True,
          refused=f"/etc/default/grub decides '{NOUVEAU_GRUB}'",
          fix="sed -i '/nouveau.modeset=1/d' /etc/default/grub"),
    Drift("nouveau.modeset=1 in a later /etc/default/grub.d file",
          "echo 'GRUB_CMDLINE_LINUX=\"$GRUB_CMDLINE_LINUX nouveau.modeset=1\"' > /etc/default/grub.d/90-local.cfg",
          {NOUVEAU_GRUB: (NOUVEAU_FLAGS,
                          "nouveau.modeset=1 last, from /etc/default/grub.d/90-local.cfg line 1 (GRUB_CMDLINE_LINUX)")},
          "stops before changing anything, naming the file and its line", tags=("nouveau",), twice=True,
          refused=f"/etc/default/grub.d/90-local.cfg decides '{NOUVEAU_GRUB}'",
          fix="rm /etc/default/grub.d/90-local.cfg"),
    Drift("nouveau loaded at boot by modules-load.d",
          "echo nouveau > /etc/modules-load.d/gpu.conf",
          {"nouveau in modules-load.d": ("none", "/etc/modules-load.d/gpu.conf line 1: nouveau")},
          "stops before changing anything, naming the file and its line", tags=("nouveau",), twice=True,
          refused=f"/etc/modules-load.d/gpu.conf decides 'nouveau in modules-load.d' (/etc/modules-load.d/gpu.conf"
                  f" line 1: nouveau, expected none): {NOT_OURS}; remove the line 'nouveau'",
          fix="rm /etc/modules-load.d/gpu.conf"),
    # ------------------------------------------------------------------ GPU (role nvidia_gpu; the TEST DOUBLE nvidia-smi keeps its state)
    Drift("GPU power limit lowered",
          "nvidia-smi -pl 300",
          {"GPU 0 power limit": ("max = 400 W ±1 W", "300 W")},
          "sets the limit again", tags=("nvidia_gpu",)),
    Drift("GPU persistence mode off",
          "nvidia-smi -pm 0",
          {"GPU 0 persistence mode": ("on", "off")},
          "turns it on again", tags=("nvidia_gpu",)),
    # ------------------------------------------------------------------ vLLM units (role vllm_service)
    Drift("env file made world-readable",
          "chmod 0644 /etc/vllm/chat.env",
          {f"{UNIT}: EnvironmentFile mode": ("0600", "0644")},
          "sets the mode back", tags=("vllm_service",)),
    Drift("unit's GPU pinning edited",
          f"sed -i 's/^Environment=CUDA_VISIBLE_DEVICES=.*/Environment=CUDA_VISIBLE_DEVICES=0/' {UNIT_FILE} && {RELOAD_AND_RESTART}",
          {f"{UNIT}: Environment CUDA_VISIBLE_DEVICES": ("{uuid}", "0")},
          "rewrites the unit, restarts it", tags=("vllm_service",)),
    Drift("a flag added to ExecStart",
          f"sed -i 's|^ExecStart=.*|& --enforce-eager|' {UNIT_FILE} && {RELOAD_AND_RESTART}",
          {f"{UNIT}: ExecStart": (COMMAND_LINE, f"{COMMAND_LINE} --enforce-eager")},
          "rewrites the unit, restarts it", tags=("vllm_service",)),
    Drift("instance config file edited",
          f"sed -i 's/^block-size: 16$/block-size: 32/' /etc/vllm/chat.yaml && systemctl restart {UNIT}",
          {f"{UNIT}: config file /etc/vllm/chat.yaml": ("as rendered (9 lines)",
                                                         "line 8: 'block-size: 32' instead of 'block-size: 16'")},
          "rewrites the file, restarts the unit", tags=("vllm_service",)),
    Drift("instance stopped",
          f"systemctl stop {UNIT}",
          {f"{UNIT}: active": ("active", "inactive (dead)"), **SERVER_DOWN},
          "starts it", tags=("vllm_service",)),
    Drift("instance's server killed (audited before its unit restarts it, RestartSec=10)",
          f"kill -9 $(systemctl show -p MainPID --value {UNIT})",
          {f"{UNIT}: active": ("active", "activating (auto-restart)"), **SERVER_DOWN},
          "nothing to do: the unit restarts it within seconds", tags=("vllm_service",), heals_by_itself=True),
    # ------------------------------------------------------------------ sysctl precedence (helper B's section)
    Drift("a later sysctl.d file overrides ours",
          "printf '# tuning\\nkernel.pid_max = 4194304\\nvm.swappiness = 60\\n' > /etc/sysctl.d/99-zz-override.conf",
          {"sysctl at boot: vm.swappiness": (f"1 ({SYSCTL_FILE})", "60 (/etc/sysctl.d/99-zz-override.conf)")},
          "comments out that line (a marker names our file), keeps the file's other lines", tags=("sysctl",)),
    Drift("a vendor sysctl.d file overrides ours",
          "printf 'vm.max_map_count = 65530\\nnet.core.somaxconn = 4096\\n' > /usr/lib/sysctl.d/99-vendor-tuning.conf",
          {"sysctl at boot: vm.max_map_count": (f"262144 ({SYSCTL_FILE})", "65530 (/usr/lib/sysctl.d/99-vendor-tuning.conf)")},
          "a same-named copy in /etc/sysctl.d with that line commented out overrides it (the vendor file is not edited)",
          tags=("sysctl",)),
    Drift("/etc/sysctl.conf overrides ours",
          "echo 'vm.swappiness = 60' >> /etc/sysctl.conf",
          {"sysctl at boot: vm.swappiness": (f"1 ({SYSCTL_FILE})", "60 (/etc/sysctl.d/99-sysctl.conf -> /etc/sysctl.conf)")},
          "comments out that line of /etc/sysctl.conf (Debian's link 99-sysctl.conf stays)", tags=("sysctl",)),
    # ------------------------------------------------------------------ unit drop-ins, masked units (helper C1's section)
    Drift("a drop-in of the unit overrides its GPU pinning (systemctl edit)",
          f"mkdir -p {OWN_DROPIN_DIR} && printf '[Service]\\nEnvironment=CUDA_VISIBLE_DEVICES=1\\n' > {OWN_DROPIN}"
          f" && {RELOAD_AND_RESTART}",
          {f"{UNIT}: drop-ins": ("none that change a managed setting", f"{OWN_DROPIN} sets Environment CUDA_VISIBLE_DEVICES"),
           f"{UNIT}: Environment CUDA_VISIBLE_DEVICES": ("{uuid}", f"1 (from {OWN_DROPIN})")},
          "removes the drop-in (the unit's own), reloads systemd, restarts the unit", tags=("vllm_service",)),
    Drift("a drop-in of the unit resets ExecStart",
          f"mkdir -p {OWN_DROPIN_DIR} && printf '[Service]\\nExecStart=\\nExecStart={COMMAND_LINE} --enforce-eager\\n'"
          f" > {OWN_DROPIN} && {RELOAD_AND_RESTART}",
          {f"{UNIT}: drop-ins": ("none that change a managed setting", f"{OWN_DROPIN} replaces ExecStart"),
           f"{UNIT}: ExecStart": (COMMAND_LINE, f"{COMMAND_LINE} --enforce-eager (from {OWN_DROPIN})")},
          "removes the drop-in (the unit's own), reloads systemd, restarts the unit", tags=("vllm_service",)),
    Drift("a shared drop-in (every vllm-* service) sets the GPU pinning",
          f"mkdir -p /etc/systemd/system/vllm-.service.d && printf '[Service]\\nEnvironment=CUDA_VISIBLE_DEVICES=1\\n'"
          f" > {SHARED_DROPIN} && {RELOAD_AND_RESTART}",
          {f"{UNIT}: drop-ins": ("none that change a managed setting", f"{SHARED_DROPIN} sets Environment CUDA_VISIBLE_DEVICES"),
           f"{UNIT}: Environment CUDA_VISIBLE_DEVICES": ("{uuid}", f"1 (from {SHARED_DROPIN})")},
          "stops before changing anything: the file applies to other units too",
          tags=("vllm_service",),
          refused=f"{SHARED_DROPIN} sets Environment CUDA_VISIBLE_DEVICES, which vllm-provision sets in {UNIT}; "
                  "it applies to every service whose name starts with vllm-",
          fix=f"rm {SHARED_DROPIN} && {RELOAD_AND_RESTART}"),
    Drift("unit masked (and stopped)",
          f"systemctl stop {UNIT} && rm {UNIT_FILE} && systemctl mask {UNIT} && systemctl daemon-reload",
          {f"{UNIT}: unit file": (f"loaded from {UNIT_FILE}",
                                  f"masked ({UNIT_FILE} -> /dev/null): provision apply unmasks it"
                                  f" (by hand: systemctl unmask {UNIT}, then provision apply)")},
          "removes the mask, writes the unit again, reloads systemd, starts it (its other rows were n/a)",
          tags=("vllm_service",)),
    # ------------------------------------------------------------------ boot unit, vLLM version, managed files (helper C2's section)
    Drift("GPU boot unit disabled",
          f"systemctl disable {GPU_BOOT_UNIT}",
          {f"{GPU_BOOT_UNIT}: enabled": ("enabled", "disabled")},
          "enables it again (the power limits come back at the next boot)", tags=("nvidia_gpu",)),
    Drift("another vLLM version installed in the venv",
          f"/opt/vllm/venvs/0.25.0/bin/pip install -q --no-index {OTHER_VLLM_WHEEL}",
          {"vLLM in /opt/vllm/venvs/0.25.0": ("0.25.0", "0.33.0"),
           RESTART_PENDING: (NO_RESTART, "restart pending: /opt/vllm/venvs/0.25.0/bin/vllm (changed TIME), after"
                                         " pid PID started TIME")},
          "installs the pinned version again, restarts the instances on it", tags=("vllm_install", "vllm_service")),
    Drift("a managed script edited",
          f"echo '# local change' >> {WAIT_READY}",
          {f"file {WAIT_READY}": (f"as rendered ({WAIT_READY_LINES} lines, root:root 0755)",
                                  f"line {WAIT_READY_LINES + 1}: '# local change' added (root:root 0755)")},
          "copies it again", tags=("vllm_service",)),
    Drift("GPU boot script removed",
          f"rm {GPU_SCRIPT}",
          {f"file {GPU_SCRIPT}": (f"as rendered ({GPU_SCRIPT_LINES} lines, root:root 0755)", "(absent)")},
          "installs it again, re-applies the settings through the boot unit", tags=("nvidia_gpu",)),
    Drift("GPU settings file's mode changed",
          f"chmod 0600 {GPU_SETTINGS}",
          {f"file {GPU_SETTINGS}": ("as rendered (6 lines, root:root 0644)", "as rendered (6 lines, root:root 0600)")},
          "sets the mode back, re-applies the settings through the boot unit", tags=("nvidia_gpu",)),
    Drift("unit's description edited (a line no setting row reads)",
          f"sed -i 's/^Description=.*/Description=my chat server/' {UNIT_FILE} && systemctl daemon-reload",
          {f"file {UNIT_FILE}": ("as rendered (51 lines, root:root 0644)",
                                 "line 3: 'Description=my chat server' instead of "
                                 "'Description=vLLM chat: Qwen/Qwen3-1.7B on port 8000' (root:root 0644)"),
           RESTART_PENDING: (NO_RESTART, f"restart pending: {UNIT_FILE} (changed TIME), after pid PID started TIME")},
          "rewrites the unit, restarts it", tags=("vllm_service",)),
    # the driver not up when the boot unit ran (the TEST DOUBLE nvidia-smi fails every call while FAIL_AT_BOOT
    # is high), its retries stopped; the start limit is reset first, so that the runs before count for nothing
    Drift("GPU boot unit's last run failed",
          f"systemctl reset-failed {GPU_BOOT_UNIT}; echo 1000000 > {FAIL_AT_BOOT}; systemctl restart {GPU_BOOT_UNIT};"
          f" systemctl stop {GPU_BOOT_UNIT}; rm {FAIL_AT_BOOT}",
          {f"{GPU_BOOT_UNIT}: last run": ("success", "exit-code (status 1 at {exited}); inactive (dead)")},
          "starts it: it applies the settings", tags=("nvidia_gpu",)),
]


def markdown() -> str:
    """docs/drift-matrix.md: the table, as the docs show it."""
    lines = [
        "# Drift matrix",
        "",
        "<!-- generated from tests/integration/drift_matrix.py by `python -m tests.integration.drift_matrix`; do not edit -->",
        "",
        "Each drift below is planted alone on a host that `provision apply` set up (one venv instance `chat`,",
        "its unit `vllm-chat.service`), by `tests/integration/test_drift_matrix.py`: the spec-mode audit must",
        "fail exactly the rows listed, with this expected and actual (`{address}`, `{uuid}` and `{exited}` stand",
        "for the host's address, its GPU's UUID and the time the GPU boot unit last ended); `provision apply",
        "--check` of the roles named must change nothing and predict as many changes as the real run then makes;",
        "that run must repair it (or stop with the fix, which the user runs), and the audit must then pass.",
        "",
        "A server we did not build is audited in profile mode instead (no spec, nothing to repair): a vLLM",
        "started from a shell is tested in `tests/integration/test_audit_profile.py` and shown in [audit.md](audit.md).",
        "",
        "| drift | planted with | failed rows: check — expected → actual | next apply |",
        "|---|---|---|---|",
    ]
    for drift in DRIFTS:
        rows = "<br>".join(f"`{check}` — {expected} → {actual}" for check, (expected, actual) in drift.rows.items())
        repair = drift.repair if drift.refused is None else f"stops: {drift.refused} (fix: `{drift.fix}`)"
        repair += "; a second apply changes nothing" if drift.twice else ""
        lines.append(f"| {drift.name} | `{drift.plant.replace('|', '&#124;')}` | {rows.replace('|', '&#124;')} | {repair} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
