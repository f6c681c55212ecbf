"""The nouveau driver kept off the host (role nouveau): files, modprobe config, initramfs, module, kernel cmdline, reboot.

A container has no kernel, initramfs or boot loader of its own: those checks are n/a there.
"""

import shlex

from provisioner.audit.registry import ABSENT, each
from provisioner.audit.text import modprobe_dry_run


MODPROBE_DIRS = ("/etc/modprobe.d", "/run/modprobe.d", "/usr/local/lib/modprobe.d", "/lib/modprobe.d", "/usr/lib/modprobe.d")
INITRAMFS_SCRIPT = """\
image=/boot/initrd.img-$(uname -r)
if [ ! -e "$image" ]; then echo "no initramfs at $image"; exit 3; fi
if ! command -v lsinitramfs >/dev/null; then echo "no lsinitramfs to read $image"; exit 3; fi
echo "$image"; lsinitramfs "$image" | grep -x -F {path}"""


def commands(expected):
    nouveau = expected["nouveau"]
    found = {
        "modprobe": "cat " + " ".join(f"{directory}/*.conf" for directory in MODPROBE_DIRS) + " 2>/dev/null",
        "cmdline": "cat /proc/cmdline",
    }
    for index, path in enumerate(nouveau_files(nouveau)):
        found[f"file{index}"] = f"cat {shlex.quote(path)}"
    for index, module in enumerate(nouveau.get("modules", [])):
        found[f"modprobe_dry{index}"] = f"modprobe -n -v {shlex.quote(module)}"
    if nouveau.get("initramfs_file"):
        found["initramfs"] = INITRAMFS_SCRIPT.format(path=shlex.quote(nouveau["initramfs_file"]))
    if nouveau.get("reboot_marker"):
        found["reboot"] = f"cat {shlex.quote(nouveau['reboot_marker']['path'])}"
    return found


def read(expected, out):
    nouveau = expected["nouveau"]
    return {
        "files": {path: out[f"file{index}"].text if out[f"file{index}"].rc == 0 else None
                  for index, path in enumerate(nouveau_files(nouveau))},
        "modprobe_lines": {" ".join(line.split()) for line in out["modprobe"].text.splitlines()},
        # module → what `modprobe -n -v module` would do
        "modprobe_dry_runs": {module: out[f"modprobe_dry{index}"] for index, module in enumerate(nouveau.get("modules", []))},
        "cmdline": out["cmdline"].text.split(),
        "initramfs": out.get("initramfs"),
        "reboot_lines": set(out["reboot"].text.splitlines()) if "reboot" in out and out["reboot"].rc == 0 else set(),
    }


def nouveau_files(nouveau):
    return [*nouveau.get("files", {}), *nouveau.get("absent_files", [])]


def when_enabled(key: str):
    """The check runs once per host that blacklists nouveau and has `key` in its expectations."""
    return each(lambda expected: [expected["nouveau"]] if expected["nouveau"].get(key) else [], ids=lambda _: key)


@each(lambda expected: expected["nouveau"].get("files", {}).items(), ids=lambda file: file[0])
def file(case, facts, audit):
    """`nouveau file: PATH` — each file the nouveau role writes, its whole content against the rendered template.

    Modes: spec.
    """
    path, content = case.item
    audit.expect(f"nouveau file: {path}", content, facts.files[path] or ABSENT)


@each(lambda expected: expected["nouveau"].get("absent_files", []))
def file_removed(case, facts, audit):
    """`nouveau file: PATH` — a file the role removes (blacklisting turned off) is absent.

    Modes: spec.
    """
    path = case.item
    audit.expect(f"nouveau file: {path}", ABSENT, ABSENT if facts.files[path] is None else "present")


@when_enabled("modprobe_lines")
def blacklisted_in_modprobe_config(case, facts, audit):
    """`nouveau blacklisted in modprobe.d` — the blacklist's lines (as the role renders them) found in modprobe.d.

    Modes: spec, profile.
    """
    lines = case.item["modprobe_lines"]
    found = [line for line in lines if line in facts.modprobe_lines]
    audit.expect("nouveau blacklisted in modprobe.d", lines, found or "none of these lines")


@when_enabled("initramfs_file")
def in_initramfs(case, facts, audit):
    """`nouveau blacklist in the initramfs` — the current initramfs holds our modprobe.d file (lsinitramfs); else n/a.

    Modes: spec.
    """
    path = case.item["initramfs_file"]
    check, expected = "nouveau blacklist in the initramfs", f"contains {path}"
    if facts.container:
        audit.not_applicable(check, expected, f"a container ({facts.container}) boots no initramfs")
    if facts.initramfs.rc == 3:
        audit.not_applicable(check, expected, facts.initramfs.text.strip())
    image = facts.initramfs.text.splitlines()[0]
    audit.expect(check, expected, expected if facts.initramfs.rc == 0 else f"{image} lacks {path}")


@each(lambda expected: expected["nouveau"].get("modules", []))
def modprobe_refuses_module(case, facts, audit):
    """`modprobe refuses MODULE` — what `modprobe -n -v MODULE` would do: an install line instead of loading it.

    Modes: spec, profile.

    `blacklist` alone still lets `modprobe nouveau` (or a module needing it) load it."""
    module = case.item
    check, expected = f"modprobe refuses {module}", "install /bin/false (modprobe -n -v)"
    if facts.container:
        audit.not_applicable(check, expected, f"a container ({facts.container}) loads no kernel modules")
    dry_run = facts.modprobe_dry_runs[module]
    refused, actual = modprobe_dry_run(module, dry_run.text)
    audit.expect(check, expected, actual if dry_run.text.strip() else f"exit {dry_run.rc}, no output", passed=refused)


@when_enabled("cmdline_flags")
def kernel_cmdline(case, facts, audit):
    """`kernel cmdline: nouveau flags` — the role's kernel flags found in /proc/cmdline; n/a in a container.

    Modes: spec, profile.
    """
    flags = case.item["cmdline_flags"]
    check = "kernel cmdline: nouveau flags"
    if facts.container:
        audit.not_applicable(check, flags, f"a container ({facts.container}) has no kernel command line of its own")
    found = [flag for flag in flags if flag in facts.cmdline]
    audit.expect(check, flags, found or "none of them")


@when_enabled("reboot_marker")
def no_reboot_pending(case, facts, audit):
    """`reboot pending for nouveau` — no reboot the role asked for is still pending (its reboot marker line).

    Modes: spec.
    """
    marker = case.item["reboot_marker"]
    check = "reboot pending for nouveau"
    if facts.container:
        audit.not_applicable(check, "no", f"a container ({facts.container}) is not rebooted for its kernel")
    pending = marker["line"] in facts.reboot_lines
    audit.expect(check, "no", f"yes ({marker['line']} in {marker['path']})" if pending else "no")
