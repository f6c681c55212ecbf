#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0
# Part of vllm-provision (role nvidia_driver). Runs on the target: standard library only (apt-get, not
# python3-apt, which minimal servers lack).

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nvidia_driver
short_description: Read the NVIDIA driver's state; install a pinned branch of it with DKMS, held
description:
  - Reads what the host has - the driver's packages and their holds (C(dpkg-query)), the kernels the module must
    be built for (the image that boots next and the running one; in a container, the kernels whose headers are
    installed), the module's version built for each (C(modinfo -k)), C(dkms status), the loaded module's version,
    whether nouveau is loaded, a container, Secure Boot, a driver installed by NVIDIA's runfile - and which package
    set O(package_sets) gives for the host's release, O(source), O(branch) and O(modules).
  - With O(state=present), a host already at the branch (every package of the set installed in the branch - at
    O(version) when given -, its companions and kernel headers installed, no package of another set, the module of
    that version built for every target kernel) is left alone - no C(apt-get update), no transaction; only the holds
    are put right.
  - Otherwise one transaction - C(apt-get update), then C(apt-get install --no-install-recommends --purge) of the set at
    the newest version of the branch apt knows, its companions and the kernel headers, removing the packages of the
    release's other sets (another branch, source or modules flavour) - after which the module must be built for
    every target kernel (else the task fails with DKMS's build log); the set is held with C(apt-mark hold).
  - Another process holding apt's locks (unattended-upgrades, apt-daily) is waited for, at most O(lock_timeout)
    seconds for the whole task (module_utils apt_lock, as module apt_packages); past that the task fails naming
    the process.
  - Where no module was loaded (and nouveau is not), loads the new one with C(modprobe nvidia); returns why a
    reboot is still needed (C(facts.reboot_reasons)). It never reboots.
version_added: "0.1.0"
author: vllm-provision contributors (@vllm-provision)
options:
  state:
    description: C(facts) only reads; C(present) installs the branch where the host is not at it.
    type: str
    choices: [facts, present]
    default: facts
  package_sets:
    description:
      - The package sets, C({release codename - {source - {branch or any - {open or proprietary - set}}}}), a set being
        C({packages, companions, module}) or a string saying why it is not offered (the role's C(vars/packages.yml)).
    type: dict
    required: true
  source:
    description: C(nvidia) (NVIDIA's CUDA repository, configured by the caller) or C(distribution).
    type: str
    choices: [nvidia, distribution]
    default: nvidia
  branch:
    description: The driver branch, digits (C(580)).
    type: str
    required: true
  version:
    description: An exact upstream version of the branch (C(580.95.05)); null - the newest apt knows.
    type: str
  modules:
    description: The kernel modules flavour.
    type: str
    choices: [open, proprietary]
    default: open
  hold:
    description: Hold the set's packages (C(apt-mark hold)) so that upgrades leave them; false releases our holds.
    type: bool
    default: true
  headers:
    description: The kernel headers packages to install; null - the headers metapackage of each installed kernel
      image metapackage and C(linux-headers-<kernel>) of each target kernel (no image - O(headers_fallback)).
    type: list
    elements: str
  headers_fallback:
    description: C({distribution id - headers package}) for a host without a kernel image (C({arch}) is dpkg's architecture).
    type: dict
    default: {}
  update_cache:
    description: Run C(apt-get update) before a transaction.
    type: bool
    default: true
  expect_gpus:
    description: Whether the host has NVIDIA GPUs (no module loaded is then a reason to reboot).
    type: bool
    default: true
  cleanup:
    description: After a transaction, the packages apt would now autoremove that match these globs are purged (what
      the removed sets depended on, e.g. C(libnvidia-tesla-470-ml1)); others apt would autoremove are left alone.
    type: list
    elements: str
    default: []
  lock_timeout:
    description: How many seconds the task waits for apt's locks, its apt commands together, before it fails.
    type: int
    default: 300
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Reads everything and simulates the transaction (C(apt-get install --simulate) against the lists apt has;
      no C(apt-get update)); returns what it would install, remove and hold. Nothing changes.
  diff_mode:
    support: full
    details: Before and after - one C(package version) line per package of the driver's sets and the headers.
  platform:
    support: full
    platforms: debian
notes:
  - Needs root (C(become)).
  - The module's name differs by source - Debian renames it (C(nvidia-current), C(nvidia-tesla-470)); NVIDIA's and
    Ubuntu's packages keep C(nvidia). Its loaded version is read from C(/sys/module/nvidia/version) either way.
"""

EXAMPLES = r"""
- name: Read the driver (nothing changes)
  vllm_provision.gpu_host.nvidia_driver:
    package_sets: "{{ _nvidia_driver_package_sets }}"
    branch: "580"
  register: driver

- name: Debian's own 535, proprietary modules, held
  vllm_provision.gpu_host.nvidia_driver:
    state: present
    package_sets: "{{ _nvidia_driver_package_sets }}"
    source: distribution
    branch: "535"
    modules: proprietary
  become: true
"""

RETURN = r"""
facts:
  description: The host after the task (in check mode, as it is), as read.
  returned: always
  type: dict
  sample:
    release: bookworm
    distribution: debian
    in_container: false
    running_kernel: 6.1.0-57-amd64
    boot_kernel: 6.1.0-57-amd64
    target_kernels: [6.1.0-57-amd64]
    set: {packages: [nvidia-kernel-dkms, nvidia-smi, libcuda1, libnvidia-cfg1], companions: [nvidia-persistenced],
          module: nvidia-current}
    set_problem: null
    installed: {nvidia-kernel-dkms: 535.309.01-0+deb12u1, nvidia-smi: 535.309.01-0+deb12u1}
    held: [nvidia-kernel-dkms, nvidia-smi]
    installed_version: 535.309.01
    module_versions: {6.1.0-57-amd64: 535.309.01}
    dkms: [{module: nvidia-current, version: 535.309.01, kernel: 6.1.0-57-amd64, arch: x86_64, state: installed}]
    loaded_version: 535.309.01
    nouveau_loaded: false
    headers: [linux-headers-amd64, linux-headers-6.1.0-57-amd64]
    other_packages: []
    at_branch: true
    not_at_branch: []
    runfile: false
    secure_boot: false
    reboot_reasons: []
install:
  description: The set's packages and the versions installed (in check mode, that would be).
  returned: always
  type: dict
remove:
  description: The other sets' packages removed (purged).
  returned: always
  type: list
  elements: str
hold:
  description: The packages put on hold.
  returned: always
  type: list
  elements: str
unhold:
  description: The packages whose hold was released.
  returned: always
  type: list
  elements: str
commands:
  description: The commands that changed the host, in order (none in check mode).
  returned: always
  type: list
  elements: list
changed_driver:
  description: Whether the driver's packages changed (or, in check mode, would).
  returned: always
  type: bool
"""

import fnmatch
import glob
import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.vllm_provision.gpu_host.plugins.module_utils.apt_lock import (
    ENVIRONMENT,
    LOCK_TIMEOUT_S,
    Busy,
    LockWait,
    waited_note,
)
from ansible_collections.vllm_provision.gpu_host.plugins.module_utils.nvidia_driver_state import (
    DPKG_FORMAT,
    SetProblem,
    at_branch_problems,
    choose_set,
    choose_versions,
    describe_packages,
    driver_version,
    header_kernels_of,
    headers_packages,
    hold_changes,
    installed_versions,
    other_packages,
    parse_dkms_status,
    parse_dpkg_query,
    parse_madison,
    parse_simulation,
    reboot_reasons,
    target_kernels,
    upstream_version,
)

APT_ENVIRONMENT = ENVIRONMENT
SECURE_BOOT_VAR = "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-e39e07d26f3c"
LOG_LINES = 40


class Failed(Exception):
    """The task fails with this message (and the facts read so far)."""


def read_text(path, default=None):
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return default


def os_release():
    fields = {}
    for line in (read_text("/etc/os-release") or "").splitlines():
        if "=" in line:
            key, value = line.split("=", 1)
            fields[key] = value.strip().strip('"')
    return fields


class Host:
    """The host's driver state, read and changed through its own tools, for one module run."""

    def __init__(self, module):
        self.module = module
        self.params = module.params
        self.commands = []
        self.locks = LockWait(self._run_once, timeout=module.params["lock_timeout"])

    def _run_once(self, argv):
        return self.module.run_command(argv, environ_update=APT_ENVIRONMENT)

    def run(self, argv, changes=False, check=True, locked=None):
        """Run a command; locked: it takes apt's locks - `wait` it waits for the dpkg locks itself (apt-get install,
        purge), `retry` it does not (apt-get update, apt-mark): tried again while another process holds them, within
        the task's bound (Failed past it)."""
        try:
            rc, out, err = self.locks.run(argv, apt_waits=locked == "wait") if locked else self._run_once(argv)
        except Busy as busy:
            raise Failed(str(busy))
        if changes:
            self.commands.append(argv)
        if check and rc != 0:
            raise Failed("`%s` exited %d: %s" % (" ".join(argv), rc, tail(err or out)))
        return rc, out, err

    def has(self, tool):
        return self.module.get_bin_path(tool) is not None

    # -- reading --------------------------------------------------------------------------------
    def read(self):
        release_fields = os_release()
        distribution = release_fields.get("ID", "")
        release = release_fields.get("VERSION_CODENAME") or release_fields.get("UBUNTU_CODENAME", "")
        packages = parse_dpkg_query(self.run(["dpkg-query", "--show", "--showformat=" + DPKG_FORMAT])[1])
        installed = installed_versions(packages)
        running = os.uname().release
        boot_kernels = [name[len("vmlinuz-"):] for name in listdir("/boot") if name.startswith("vmlinuz-")]
        header_kernels = [kernel for kernel in header_kernels_of(installed)
                          if os.path.isdir("/lib/modules/%s/build" % kernel)]
        targets = target_kernels(boot_kernels, running, header_kernels)
        facts = dict(release=release, distribution=distribution, in_container=self.in_container(),
                     running_kernel=running, boot_kernel=targets[0] if boot_kernels else None,
                     target_kernels=targets, set=None, set_problem=None,
                     loaded_version=(read_text("/sys/module/nvidia/version") or "").strip() or None,
                     nouveau_loaded=any(line.split(" ", 1)[0] == "nouveau"
                                        for line in (read_text("/proc/modules") or "").splitlines()),
                     runfile=os.path.exists("/usr/bin/nvidia-uninstall"), secure_boot=secure_boot())
        try:
            chosen = choose_set(self.params["package_sets"], release, self.params["source"], self.params["branch"],
                                self.params["modules"])
        except SetProblem as problem:
            chosen = None
            facts["set_problem"] = str(problem)
        facts["dkms"] = parse_dkms_status(self.run(["dkms", "status"], check=False)[1]) if self.has("dkms") else []
        if chosen is None:
            facts.update(installed={}, held=[], installed_version=None, module_versions={}, headers=[],
                         other_packages=[], at_branch=False, not_at_branch=[facts["set_problem"]], reboot_reasons=[])
            return facts, packages
        headers = self.params["headers"]
        if headers is None:
            fallback = self.params["headers_fallback"].get(distribution, "").replace("{arch}", self.architecture())
            headers = headers_packages(installed, targets, boot_kernels, fallback)
        release_sets = self.params["package_sets"].get(release, {})
        others = other_packages(release_sets, self.params["source"], self.params["branch"], self.params["modules"],
                                chosen, installed)
        kernels = targets + ([running] if running not in targets and os.path.isdir("/lib/modules/" + running) else [])
        module_versions = {kernel: self.modinfo(kernel, chosen["module"]) for kernel in kernels}
        relevant = chosen["packages"] + chosen["companions"] + others
        not_at_branch = at_branch_problems(chosen, installed, others, headers,
                                           {kernel: module_versions[kernel] for kernel in targets},
                                           self.params["branch"], self.params["version"])
        installed_version = driver_version(chosen, installed)
        facts.update(
            set=chosen,
            installed={name: installed[name] for name in relevant if name in installed},
            held=sorted(name for name in relevant + headers if packages.get(name, {}).get("want") == "hold"),
            installed_version=installed_version,
            module_versions=module_versions,
            headers=headers,
            other_packages=others,
            at_branch=not not_at_branch,
            not_at_branch=not_at_branch,
            reboot_reasons=reboot_reasons(facts["in_container"], running, facts["boot_kernel"], installed_version,
                                          module_versions, facts["loaded_version"], facts["nouveau_loaded"],
                                          self.params["expect_gpus"]),
        )
        return facts, packages

    def in_container(self):
        if self.has("systemd-detect-virt"):
            return self.run(["systemd-detect-virt", "--container"], check=False)[0] == 0
        return os.path.exists("/run/systemd/container") or os.path.exists("/.dockerenv")

    def architecture(self):
        return self.run(["dpkg", "--print-architecture"])[1].strip()

    def modinfo(self, kernel, module):
        rc, out, dummy = self.run(["modinfo", "-k", kernel, "-F", "version", module], check=False)
        return out.strip() or None if rc == 0 else None

    def build_log(self, facts):
        """The end of DKMS's build log of the set's module, for a failed build."""
        for entry in facts["dkms"]:
            if entry["module"] == facts["set"]["module"]:
                # a failed build leaves its log in build/; a built one beside the module
                for log in ["/var/lib/dkms/%s/%s/build/make.log" % (entry["module"], entry["version"])] + sorted(
                        glob.glob("/var/lib/dkms/%s/%s/*/*/log/make.log" % (entry["module"], entry["version"]))):
                    text = read_text(log)
                    if text:
                        return "; DKMS's %s ends: %s" % (log, tail(text, LOG_LINES))
        return ""

    # -- changing -------------------------------------------------------------------------------
    def madison(self, names):
        return parse_madison(self.run(["apt-cache", "madison"] + names, check=False)[1])

    def install_argv(self, versions, chosen, headers, others, simulate):
        argv = ["apt-get", "install", "--yes", "--no-install-recommends", "--purge", "--allow-downgrades",
                "--allow-change-held-packages", "-o", "Dpkg::Options::=--force-confdef",
                "-o", "Dpkg::Options::=--force-confold"]
        argv += ["--simulate"] if simulate else []
        return argv + ["%s=%s" % item for item in sorted(versions.items())] + chosen["companions"] + headers \
            + ["%s-" % name for name in others]


def listdir(path):
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def secure_boot():
    """Whether UEFI Secure Boot is on (the EFI variable's last byte), read without mokutil."""
    try:
        with open(SECURE_BOOT_VAR, "rb") as handle:
            data = handle.read()
    except OSError:
        return False
    return bool(data) and data[-1] == 1


def tail(text, lines=12):
    return " | ".join(line for line in text.strip().splitlines()[-lines:] if line.strip())


def secure_boot_problem(host, facts):
    """Why a module DKMS builds would not load under Secure Boot (its signing key not enrolled), or None."""
    if not facts["secure_boot"] or facts["in_container"]:
        return None
    key = "/var/lib/dkms/mok.pub"
    if os.path.exists(key) and host.has("mokutil"):
        rc, out, err = host.run(["mokutil", "--test-key", key], check=False)
        if "already enrolled" in (out + err):
            return None
    return ("Secure Boot is on and DKMS's signing key %s is not enrolled: the module DKMS builds would not load. "
            "Create and enroll it (dkms generate_mok; mokutil --import %s, then confirm at the next boot), or turn "
            "Secure Boot off, then apply again" % (key, key))


def transaction(host, facts, packages, result):
    """Install the set (simulate in check mode); fill result's install/remove; return the apt output."""
    module, params = host.module, host.params
    chosen, headers, others = facts["set"], facts["headers"], facts["other_packages"]
    problem = secure_boot_problem(host, facts)
    if problem:
        raise Failed(problem)
    if params["update_cache"] and not module.check_mode:
        host.run(["apt-get", "update", "-q"], changes=True, locked="retry")
    madison = host.madison(chosen["packages"] + headers)
    versions, missing = choose_versions(chosen, madison, params["branch"], params["version"])
    wanted = params["version"] or "branch %s" % params["branch"]
    result["remove"] = others
    unknown_headers = [name for name in headers if name not in madison]
    if module.check_mode and (missing or unknown_headers):
        result["install"] = {name: versions.get(name, wanted) for name in chosen["packages"]}
        result["msg"] = "would install %s of %s with %s; would remove %s (not simulated: apt's lists here have no %s " \
            "yet, the run updates them first)" % (
                ", ".join(chosen["packages"]), wanted, ", ".join(chosen["companions"] + headers),
                ", ".join(others) or "nothing", ", ".join([item["package"] for item in missing] + unknown_headers))
        return None
    if missing:
        raise Failed("no version of %s in %s in the host's apt sources (%s) — %s" % (
            ", ".join(item["package"] for item in missing), wanted,
            "; ".join("%s has %s" % (item["package"], ", ".join(item["versions"]) or "none") for item in missing),
            "configure the source that has it (source: nvidia configures NVIDIA's repository), or pin another branch"))
    if unknown_headers:
        raise Failed("apt knows no package %s: DKMS needs the headers of the kernel it builds for — install that "
                     "kernel's headers, or upgrade the kernel to one whose headers the apt sources have" % (
                         ", ".join(unknown_headers)))
    result["install"] = versions
    # another set's package that the chosen set upgrades (a dependency of the same name, NVIDIA's nvidia-smi
    # replacing Debian's) stays: only those the transaction leaves as they are go
    kept = {step["package"] for step in simulate(host, host.install_argv(versions, chosen, headers, [], True))
            if step["action"] == "install"}
    others = result["remove"] = [name for name in others if name not in kept]
    argv = host.install_argv(versions, chosen, headers, others, simulate=module.check_mode)
    rc, out, err = host.run(argv, changes=not module.check_mode, check=False,
                            locked=None if module.check_mode else "wait")
    if rc != 0:
        raise Failed("`%s` exited %d: %s%s" % (" ".join(argv), rc, tail(err or out, LOG_LINES),
                                               "" if module.check_mode else host.build_log(host.read()[0])))
    return out


def simulate(host, argv):
    """What apt-get would do: the steps of its simulation (a failure is the real run's to report)."""
    rc, out, dummy = host.run(argv, check=False)
    return parse_simulation(out) if rc == 0 else []


def purge_orphans(host, globs):
    """Purge what the removed sets left (the packages apt would autoremove now that match `globs`): the driver's
    own leftovers, never other packages apt would autoremove."""
    steps = simulate(host, ["apt-get", "autoremove", "--simulate", "--purge"])
    orphans = sorted(step["package"] for step in steps if step["action"] != "install"
                     and any(fnmatch.fnmatchcase(step["package"], glob) for glob in globs))
    if orphans:
        host.run(["apt-get", "purge", "--yes", "--allow-change-held-packages"] + orphans, changes=True, locked="wait")
    return orphans


def predicted(facts, steps):
    """The driver's packages after a simulated transaction: {name: version}."""
    names = set(facts["set"]["packages"] + facts["set"]["companions"] + facts["other_packages"] + facts["headers"])
    after = dict(facts["installed"])
    for step in steps:
        if step["package"] not in names:
            continue
        if step["action"] == "install":
            after[step["package"]] = step["new"]
        else:
            after.pop(step["package"], None)
    return after


def load_module(host, facts):
    """Load the new module where nothing holds the GPUs (no nvidia module loaded, nouveau not loaded), so no
    reboot is needed for it; a failure (no GPU, a module that does not load) stays a reboot reason."""
    if facts["in_container"] or facts["loaded_version"] or facts["nouveau_loaded"] or not host.params["expect_gpus"]:
        return False
    if facts["module_versions"].get(facts["running_kernel"]) != facts["installed_version"]:
        return False
    rc = host.run(["modprobe", "nvidia"], changes=True, check=False)[0]
    return rc == 0


def present(host, facts, packages, result):
    module, params = host.module, host.params
    if facts["set"] is None:
        raise Failed(facts["set_problem"])
    if facts["runfile"]:
        raise Failed("a driver installed by NVIDIA's runfile is on this host (/usr/bin/nvidia-uninstall): packages "
                     "would fight it — remove it with nvidia-uninstall, or set driver.manage: false (nvidia_driver_manage)")
    names = facts["set"]["packages"] + facts["set"]["companions"]
    before = dict(facts["installed"])
    messages = []
    if not facts["at_branch"]:
        output = transaction(host, facts, packages, result)
        result["changed"] = result["changed_driver"] = True
        if module.check_mode:
            after = predicted(facts, parse_simulation(output)) if output is not None else None
            kernels = facts["target_kernels"] or ["the kernels of the headers installed"]
            messages.append(result.get("msg") or "would install %s; would remove %s; would build %s %s for %s" % (
                ", ".join("%s %s" % item for item in sorted(result["install"].items())),
                ", ".join(result["remove"]) or "nothing", facts["set"]["module"],
                upstream_version(result["install"][facts["set"]["packages"][0]]), ", ".join(kernels)))
            hold, unhold = (names, []) if params["hold"] else ([], [])
        else:
            result["remove"] += purge_orphans(host, params["cleanup"])
            facts, packages = host.read()
            problems = list(facts["not_at_branch"])
            if problems:
                raise Failed("after installing, the host is not at the branch: %s%s" % (
                    "; ".join(problems), host.build_log(facts)))
            after = dict(facts["installed"])
            messages.append("installed %s; removed %s; module %s %s built for %s" % (
                ", ".join("%s %s" % item for item in sorted(result["install"].items())),
                ", ".join(result["remove"]) or "nothing", facts["set"]["module"], facts["installed_version"],
                ", ".join(facts["target_kernels"])))
            hold, unhold = hold_changes(names, packages, params["hold"])
    else:
        after = before
        hold, unhold = hold_changes(names, packages, params["hold"])
    result.update(hold=hold, unhold=unhold)
    if hold or unhold:
        result["changed"] = True
        messages += (["%s %s" % ("would hold" if module.check_mode else "held", ", ".join(hold))] if hold else []) \
            + (["%s %s" % ("would release the hold of" if module.check_mode else "released the hold of",
                           ", ".join(unhold))] if unhold else [])
        if not module.check_mode:
            for verb, targets in (("hold", hold), ("unhold", unhold)):
                if targets:
                    host.run(["apt-mark", verb] + targets, changes=True, locked="retry")
            facts, packages = host.read()
    if result["changed_driver"] and not module.check_mode and load_module(host, facts):
        facts, packages = host.read()
        messages.append("loaded the nvidia module")
    if module.check_mode and result["changed_driver"] and not facts["in_container"]:
        facts = dict(facts, reboot_reasons=["the driver would be installed: its module loads at the next boot"])
    if module._diff and result["changed_driver"] and after is not None:
        result["diff"] = dict(before=describe_packages(before), after=describe_packages(after),
                              before_header="NVIDIA driver packages", after_header="NVIDIA driver packages")
    result["facts"] = facts
    if messages:
        result["msg"] = "; ".join(messages) + waited_note(host.locks)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", choices=["facts", "present"], default="facts"),
            package_sets=dict(type="dict", required=True),
            source=dict(type="str", choices=["nvidia", "distribution"], default="nvidia"),
            branch=dict(type="str", required=True),
            version=dict(type="str"),
            modules=dict(type="str", choices=["open", "proprietary"], default="open"),
            hold=dict(type="bool", default=True),
            headers=dict(type="list", elements="str"),
            headers_fallback=dict(type="dict", default={}),
            update_cache=dict(type="bool", default=True),
            expect_gpus=dict(type="bool", default=True),
            cleanup=dict(type="list", elements="str", default=[]),
            lock_timeout=dict(type="int", default=LOCK_TIMEOUT_S),
        ),
        supports_check_mode=True,
    )
    if not module.params["branch"].isdigit():
        module.fail_json(msg="branch must be digits, e.g. 580; got %r" % module.params["branch"])
    host = Host(module)
    result = dict(changed=False, changed_driver=False, install={}, remove=[], hold=[], unhold=[], commands=host.commands)
    facts = None
    try:
        facts, packages = host.read()
        result["facts"] = facts
        if module.params["state"] == "present":
            present(host, facts, packages, result)
    except Failed as error:
        module.fail_json(msg=str(error), **dict(result, facts=result.get("facts", facts)))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
