"""The nouveau driver kept off the host (role nouveau): files, modprobe config, initramfs, module, kernel cmdline, reboot.

A container has no kernel, initramfs or boot loader of its own: those checks are n/a there. The rows of the next
boot read every file that decides it (every modprobe.d file, the GRUB files, every modules-load.d file) by the
rules of plugins/module_utils/boot_config.py, which the role's module shares; they apply in a container too.
A row whose tool the host lacks (modprobe without kmod…) unknown: an error naming the tool.
"""

import shlex

from provisioner.audit.boot_files import boot_files, boot_files_command, read_boot_files
from provisioner.audit.engine import Output, command_problem, not_installed
from provisioner.audit.registry import ABSENT, each
from provisioner.audit.text import modprobe_dry_run
from provisioner.base.module_utils import boot_config

NO_FILE = 3  # the exit status of file_command where there is no such file
# exit 0: the initramfs holds the file; 1: it lacks it (grep); 3: there is no initramfs; 127: a tool is missing;
# 4: a tool failed (its message above)
INITRAMFS_SCRIPT = """\
kernel=$(uname -r) || {{ [ $? = 127 ] && exit 127; exit 4; }}
image=/boot/initrd.img-$kernel
if [ ! -e "$image" ]; then echo "no initramfs at $image"; exit 3; fi
echo "$image"
listing=$(lsinitramfs "$image") || {{ [ $? = 127 ] && exit 127; exit 4; }}
printf '%s\\n' "$listing" | grep -x -F {path}"""


def commands(expected):
    nouveau = expected["nouveau"]
    found = {**boot_files_command(), "cmdline": "cat /proc/cmdline"}
    for index, path in enumerate(nouveau_files(nouveau)):
        found[f"file{index}"] = file_command(path)
    for index, module in enumerate(nouveau.get("modules", [])):
        found[f"modprobe_dry{index}"] = f"modprobe -n -v {shlex.quote(module)}"
    if nouveau.get("initramfs_file"):
        found["initramfs"] = INITRAMFS_SCRIPT.format(path=shlex.quote(nouveau["initramfs_file"]))
    if nouveau.get("reboot_marker"):
        found["reboot"] = file_command(nouveau["reboot_marker"]["path"])
    return found


def read(expected, out):
    nouveau = expected["nouveau"]
    files = {path: file_text(out[f"file{index}"]) for index, path in enumerate(nouveau_files(nouveau))}
    reboot, reboot_problem = file_text(out["reboot"]) if "reboot" in out else (None, None)
    cmdline_problem = command_problem(out["cmdline"], "cat")
    return {
        **read_boot_files(out),
        "files": {path: text for path, (text, _) in files.items()},  # None: absent
        "file_problems": {path: problem for path, (_, problem) in files.items() if problem},
        # module → what `modprobe -n -v module` would do
        "modprobe_dry_runs": {module: out[f"modprobe_dry{index}"] for index, module in enumerate(nouveau.get("modules", []))},
        "cmdline": None if cmdline_problem else out["cmdline"].text.split(),
        "cmdline_problem": cmdline_problem,
        "initramfs": out.get("initramfs"),
        "reboot_lines": set((reboot or "").splitlines()),
        "reboot_problem": reboot_problem,
    }


def nouveau_files(nouveau):
    return [*nouveau.get("files", {}), *nouveau.get("absent_files", [])]


def file_command(path: str) -> str:
    """The file's text; exit NO_FILE where there is none (told apart from a cat that failed or is missing)."""
    quoted = shlex.quote(path)
    return f"if [ -e {quoted} ]; then cat {quoted}; else exit {NO_FILE}; fi"


def file_text(out: Output) -> tuple[str | None, str | None]:
    """A file_command's answer: (its text, None); (None, None) where there is no such file; (None, why) where the
    file could not be read."""
    if out.rc == NO_FILE:
        return None, None
    problem = command_problem(out, "cat")
    return (None, problem) if problem else (out.text, None)


def checked_file(facts, audit, check, expected, path):
    """The file's text (None: absent); the row is unknown where it could not be read."""
    if path in facts.file_problems:
        audit.unknown(check, expected, f"{path} could not be read: {facts.file_problems[path]}")
    return facts.files[path]


def when_enabled(key: str):
    """The check runs once per host that blacklists nouveau and has `key` in its expectations."""
    return each(lambda expected: [expected["nouveau"]] if expected["nouveau"].get(key) else [], ids=lambda _: key)


@each(lambda expected: expected["nouveau"].get("files", {}).items(), ids=lambda file: file[0])
def file(case, facts, audit):
    """`nouveau file: PATH` — each file the nouveau role writes, its whole content against the rendered template.

    Modes: spec.
    """
    path, content = case.item
    check = f"nouveau file: {path}"
    audit.expect(check, content, checked_file(facts, audit, check, content, path) or ABSENT)


@each(lambda expected: expected["nouveau"].get("absent_files", []))
def file_removed(case, facts, audit):
    """`nouveau file: PATH` — a file the role removes (blacklisting turned off) is absent.

    Modes: spec.
    """
    path = case.item
    check = f"nouveau file: {path}"
    audit.expect(check, ABSENT, ABSENT if checked_file(facts, audit, check, ABSENT, path) is None else "present")


@when_enabled("modprobe_lines")
def blacklisted_in_modprobe_config(case, facts, audit):
    """`nouveau blacklisted in modprobe.d` — the blacklist's lines (as the role renders them) found in modprobe.d.

    Modes: spec, profile.
    """
    lines, check = case.item["modprobe_lines"], "nouveau blacklisted in modprobe.d"
    files = boot_config.in_directories(boot_files(facts, audit, check, lines), boot_config.MODPROBE_DIRS, ".conf")
    read = {" ".join(line.split()) for _, text in files for line in text.splitlines()}
    audit.expect(check, lines, [line for line in lines if line in read] or "none of these lines")


@when_enabled("initramfs_file")
def in_initramfs(case, facts, audit):
    """`nouveau blacklist in the initramfs` — the current initramfs holds our modprobe.d file (lsinitramfs); n/a without one.

    Modes: spec.
    """
    path = case.item["initramfs_file"]
    check, expected = "nouveau blacklist in the initramfs", f"contains {path}"
    if facts.container:
        audit.not_applicable(check, expected, f"a container ({facts.container}) boots no initramfs")
    if facts.initramfs.rc == 3:
        audit.not_applicable(check, expected, facts.initramfs.text.strip())
    if facts.initramfs.rc not in (0, 1):  # 1: grep found no such line
        audit.unknown(check, expected, command_problem(facts.initramfs, "lsinitramfs"))
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
    missing = not_installed(dry_run, "modprobe")
    if missing:
        audit.unknown(check, expected, missing)
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
    if facts.cmdline is None:
        audit.unknown(check, flags, f"/proc/cmdline could not be read: {facts.cmdline_problem}")
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
    if facts.reboot_problem:
        audit.unknown(check, "no", f"{marker['path']} could not be read: {facts.reboot_problem}")
    pending = marker["line"] in facts.reboot_lines
    audit.expect(check, "no", f"yes ({marker['line']} in {marker['path']})" if pending else "no")


def at_next_boot(case, facts, audit, check):
    """The row `check` of nouveau's state at the next boot (boot_config.nouveau_findings), naming the file that
    decides."""
    files = boot_files(facts, audit, check, " ".join(case.item["cmdline_flags"]))
    row = next(row for row in boot_config.nouveau_findings(files, case.item["cmdline_flags"]) if row["check"] == check)
    if row["passed"] is None:
        audit.not_applicable(check, row["expected"], row["actual"])
    audit.expect(check, row["expected"], row["actual"], passed=row["passed"])


@when_enabled("cmdline_flags")
def modeset_in_modprobe_config(case, facts, audit):
    """`nouveau modprobe.d: modeset` — nouveau's modeset from every modprobe.d file (the last `options nouveau modeset=` wins) and its file.

    Modes: spec, profile.
    """
    at_next_boot(case, facts, audit, "nouveau modprobe.d: modeset")


@when_enabled("cmdline_flags")
def install_line_in_modprobe_config(case, facts, audit):
    """`nouveau modprobe.d: install` — the `install nouveau` line modprobe runs (the first in file name order) and its file.

    Modes: spec, profile.
    """
    at_next_boot(case, facts, audit, "nouveau modprobe.d: install")


@when_enabled("cmdline_flags")
def grub_cmdline(case, facts, audit):
    """`nouveau on the kernel command line GRUB builds` — the role's flags on the command line /etc/default/grub and grub.d/*.cfg build, no later nouveau.modeset; n/a without GRUB files.

    Modes: spec, profile.
    """
    at_next_boot(case, facts, audit, "nouveau on the kernel command line GRUB builds")


@when_enabled("cmdline_flags")
def not_in_modules_load(case, facts, audit):
    """`nouveau in modules-load.d` — no modules-load.d file (/etc, /run, /usr/local/lib, /usr/lib, /lib) loads nouveau at boot.

    Modes: spec, profile.
    """
    at_next_boot(case, facts, audit, "nouveau in modules-load.d")
