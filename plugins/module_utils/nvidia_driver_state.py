# SPDX-License-Identifier: Apache-2.0
# Part of vllm-provision. Pure functions (no I/O) over what the NVIDIA driver's host tools print:
# dpkg-query, dkms status, apt-cache madison, apt-get --simulate; which package set a host wants, what it
# has, and whether a reboot is needed. Shared by the module nvidia_driver and the audit; standard library
# only (it runs on the target).

from __future__ import annotations

import re

# dpkg-query --show --showformat: one line per package known to dpkg
DPKG_FORMAT = "${Package}\\t${Version}\\t${db:Status-Want}\\t${db:Status-Status}\\n"


# --------------------------------------------------------------------------- parsing


def parse_dpkg_query(text):
    """{package: {version, want, status}} from dpkg-query with DPKG_FORMAT. `want` is install, hold,
    deinstall or purge (hold: apt-mark hold); `status` installed, config-files, not-installed, ..."""
    packages = {}
    for line in text.splitlines():
        fields = line.split("\t")
        if len(fields) != 4 or not fields[0]:
            continue
        name, version, want, status = fields
        packages[name] = {"version": version, "want": want, "status": status}
    return packages


def installed_versions(packages):
    """{package: version} of the packages dpkg has installed (unpacked but unconfigured ones too: a failed
    transaction leaves them, and they must be counted as there)."""
    return {name: entry["version"] for name, entry in packages.items()
            if entry["status"] in ("installed", "unpacked", "half-configured", "half-installed",
                                   "triggers-awaited", "triggers-pending")}


DKMS_LINE = re.compile(
    r"^(?P<module>[^/,:\s]+)(?:/|, )(?P<version>[^,:\s]+)"
    r"(?:, (?P<kernel>[^,:\s]+)(?:, (?P<arch>[^:\s]+))?)?: (?P<state>[a-z-]+)(?P<note>.*)$")


def parse_dkms_status(text):
    """Each line of `dkms status` (dkms 3: `name/version, kernel, arch: state`; dkms 2: `name, version,
    kernel, arch: state`; a module only added has no kernel) as {module, version, kernel, arch, state, note}."""
    entries = []
    for line in text.splitlines():
        match = DKMS_LINE.match(line.strip())
        if match:
            entry = match.groupdict()
            entry["note"] = entry["note"].strip()
            entries.append(entry)
    return entries


def parse_madison(text):
    """{package: [versions, newest first]} from `apt-cache madison` (apt lists a package's versions in
    its own order, newest first); one version once even when several sources have it."""
    versions = {}
    for line in text.splitlines():
        fields = [field.strip() for field in line.split("|")]
        if len(fields) < 3 or not fields[0] or not fields[1]:
            continue
        found = versions.setdefault(fields[0], [])
        if fields[1] not in found:
            found.append(fields[1])
    return versions


SIMULATION_LINE = re.compile(
    r"^(?P<action>Inst|Remv|Purg) (?P<package>\S+)(?: \[(?P<old>[^\]]+)\])?(?: \((?P<new>\S+)[^)]*\))?")
ACTIONS = {"Inst": "install", "Remv": "remove", "Purg": "purge"}


def parse_simulation(text):
    """What `apt-get install --simulate` would do: [{action, package, old, new}] (action install, remove or
    purge; old is the installed version or None, new the version installed or None)."""
    steps = []
    for line in text.splitlines():
        match = SIMULATION_LINE.match(line)
        if match:
            steps.append({"action": ACTIONS[match["action"]], "package": match["package"],
                          "old": match["old"], "new": match["new"]})
    return steps


# --------------------------------------------------------------------------- versions and kernels


def upstream_version(version):
    """The driver's own version in a Debian version: '535.309.01-0+deb12u1' -> '535.309.01' (epoch and
    Debian revision dropped)."""
    if not version:
        return None
    without_epoch = version.split(":", 1)[1] if re.match(r"^\d+:", version) else version
    return without_epoch.rsplit("-", 1)[0] if "-" in without_epoch else without_epoch


def in_branch(version, branch, exact=None):
    """Whether a package or module version belongs to the branch (and is the exact upstream version, when
    one is asked): '580.95.05-1' is in branch '580'."""
    upstream = upstream_version(version)
    if not upstream or upstream.split(".")[0] != str(branch):
        return False
    return exact is None or upstream == exact


def kernel_sort_key(release):
    """Sort key for kernel releases as `linux-version sort` orders them: numbers as numbers."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", release) if part]


def newest_first(releases):
    return sorted(set(releases), key=kernel_sort_key, reverse=True)


def target_kernels(boot_kernels, running, header_kernels):
    """The kernels the module must be built for: the one that boots next (the newest installed image) and
    the running one when it is installed too; with no kernel image (a container), every kernel whose
    headers are installed (what DKMS builds for there)."""
    if boot_kernels:
        newest = newest_first(boot_kernels)[0]
        return [newest] + ([running] if running in boot_kernels and running != newest else [])
    return newest_first(header_kernels)


IMAGE_META = re.compile(r"^linux-image-(?P<flavour>[a-z][a-z0-9.+-]*)$")
NOT_A_FLAVOUR = re.compile(r"(^(un)?signed-|-dbg(sym)?$|-unsigned$)")


def headers_packages(installed, targets, boot_kernels, fallback):
    """The kernel headers the module is built against: for each installed kernel-image metapackage
    (linux-image-amd64 on Debian, linux-image-generic on Ubuntu) its headers metapackage, which follows
    kernel upgrades; else (no kernel image: a container) `fallback`; plus linux-headers-<K> of each target
    kernel that is an installed image."""
    flavours = sorted(match["flavour"] for match in map(IMAGE_META.match, installed)
                      if match and not match["flavour"][0].isdigit() and not NOT_A_FLAVOUR.search(match["flavour"]))
    wanted = ["linux-headers-" + flavour for flavour in flavours] or ([fallback] if fallback else [])
    wanted += ["linux-headers-" + kernel for kernel in targets if kernel in boot_kernels]
    return list(dict.fromkeys(wanted))


def header_kernels_of(packages):
    """The kernel releases whose versioned headers packages are in `packages` (linux-headers-6.1.0-57-amd64
    -> 6.1.0-57-amd64; the -common and metapackages are not kernels)."""
    kernels = []
    for name in packages:
        match = re.match(r"^linux-headers-(\d+\.\d+\S*)$", name)
        if match and not match[1].endswith("-common") and not match[1].endswith("-common-rt"):
            kernels.append(match[1])
    return newest_first(kernels)


# --------------------------------------------------------------------------- package sets


class SetProblem(Exception):
    """The host's release, source, branch and modules flavour have no package set."""


def choose_set(package_sets, release, source, branch, modules):
    """The package set for this host: {packages, companions, module}, names with the branch filled in;
    raises SetProblem saying why there is none."""
    by_source = package_sets.get(release)
    if by_source is None:
        raise SetProblem("no NVIDIA driver package set for %s (the role knows %s)" % (
            release or "this release", ", ".join(sorted(package_sets)) or "none"))
    branches = by_source.get(source)
    if branches is None:
        raise SetProblem("%s: source %s is not offered (sources for %s: %s)" % (
            release, source, release, ", ".join(sorted(by_source))))
    flavours = branches.get(str(branch), branches.get("any"))
    if flavours is None:
        raise SetProblem("%s %s has no driver branch %s (branches: %s)" % (
            release, source, branch, ", ".join(sorted(branches))))
    chosen = flavours.get(modules)
    if chosen is None or isinstance(chosen, str):
        raise SetProblem("%s %s %s, %s kernel modules: %s" % (
            release, source, branch, modules, chosen or "not offered"))
    return {
        "packages": [name.replace("{branch}", str(branch)) for name in chosen["packages"]],
        "companions": [name.replace("{branch}", str(branch)) for name in chosen.get("companions") or []],
        "module": chosen["module"],
    }


def set_patterns(chosen, branch=None):
    """A set's package names as regular expressions: '{branch}' is `branch`, or any branch."""
    return ["^%s$" % re.escape(name).replace(re.escape("{branch}"), re.escape(str(branch)) if branch else r"\d+")
            for name in chosen["packages"]]


def known_patterns(release_sets):
    """Every package name of every set of a release (all sources, branches, flavours), as regular
    expressions: '{branch}' stands for any branch."""
    return sorted({pattern for branches in release_sets.values() for flavours in branches.values()
                   for chosen in flavours.values() if isinstance(chosen, dict) for pattern in set_patterns(chosen)})


def other_packages(release_sets, source, branch, modules, chosen, installed):
    """The installed packages of the release's other sets, which go when the chosen set is installed: those of
    the other modules flavour of the same source and branch (an alternative to the chosen set), and those of any
    other set at a version outside the branch (at a version of the branch they are what the chosen set depends
    on: NVIDIA's nvidia-driver-cuda needs nvidia-smi, a name Debian's sets have too)."""
    keep = set(chosen["packages"]) | set(chosen["companions"])
    branches = release_sets.get(source, {})
    flavours = branches.get(str(branch), branches.get("any", {}))
    alternatives = [re.compile(pattern) for flavour, other in flavours.items()
                    if flavour != modules and isinstance(other, dict) for pattern in set_patterns(other, branch)]
    elsewhere = [re.compile(pattern) for pattern in known_patterns(release_sets)]
    return sorted(name for name, version in installed.items() if name not in keep and (
        any(p.match(name) for p in alternatives)
        or (any(p.match(name) for p in elsewhere) and not in_branch(version, branch))))


# --------------------------------------------------------------------------- decisions


def driver_version(chosen, installed):
    """The upstream version of the chosen set's packages when all are installed at one version, else None."""
    versions = {upstream_version(installed.get(name)) for name in chosen["packages"]}
    return versions.pop() if len(versions) == 1 and None not in versions else None


def at_branch_problems(chosen, installed, others, headers, module_versions, branch, version):
    """Why the host is not at the pinned branch (empty: it is, and is left alone): every package of the set
    installed in the branch (at `version` when given), its companions and headers installed, no other
    set's package, and the module of that version built for every target kernel."""
    problems = []
    for name in chosen["packages"]:
        have = installed.get(name)
        if have is None:
            problems.append("%s is not installed" % name)
        elif not in_branch(have, branch, version):
            problems.append("%s is %s, not %s" % (name, have, version or "in branch %s" % branch))
    problems += ["%s is not installed" % name for name in chosen["companions"] + headers if name not in installed]
    problems += ["%s (%s) is of another driver set" % (name, installed[name]) for name in others]
    expected = driver_version(chosen, installed)
    if not module_versions:
        problems.append("no kernel to build the module for (no kernel image, no kernel headers)")
    for kernel, found in sorted(module_versions.items()):
        if expected is not None and found != expected:
            problems.append("module %s for kernel %s is %s, not %s" % (
                chosen["module"], kernel, found or "missing", expected))
    return problems


def hold_changes(names, packages, hold):
    """(to hold, to unhold) among the installed `names` so that each is held exactly when `hold`."""
    present = [name for name in names if name in packages and packages[name]["status"] != "not-installed"]
    if hold:
        return [name for name in present if packages[name]["want"] != "hold"], []
    return [], [name for name in present if packages[name]["want"] == "hold"]


def choose_versions(chosen, madison, branch, version):
    """{package: the newest version apt knows in the branch (at `version` when given)} for the set's
    packages, and the packages with none: [{package, versions}]."""
    picked, missing = {}, []
    for name in chosen["packages"]:
        matching = [found for found in madison.get(name, []) if in_branch(found, branch, version)]
        if matching:
            picked[name] = matching[0]
        else:
            missing.append({"package": name, "versions": madison.get(name, [])})
    return picked, missing


def reboot_reasons(in_container, running_kernel, boot_kernel, installed_version, module_versions,
                   loaded_version, nouveau_loaded, expect_gpus):
    """Why the host must reboot for the installed driver to run (none in a container: no kernel of its
    own). `module_versions`: {kernel: the module's version built for it}, the running kernel's included."""
    if in_container or installed_version is None:
        return []
    reasons = []
    running_module = module_versions.get(running_kernel)
    if loaded_version and loaded_version != installed_version:
        reasons.append("the loaded nvidia module is %s, the installed driver %s" % (loaded_version, installed_version))
    elif not loaded_version and expect_gpus:
        reasons.append("no nvidia module is loaded (driver %s installed)" % installed_version)
    if running_module != installed_version and boot_kernel and boot_kernel != running_kernel \
            and module_versions.get(boot_kernel) == installed_version:
        reasons.append("the running kernel %s has no module of driver %s; kernel %s, which boots next, has it" % (
            running_kernel, installed_version, boot_kernel))
    if nouveau_loaded and expect_gpus:
        reasons.append("nouveau is loaded (it holds the GPUs until a boot without it)")
    return reasons


def describe_packages(versions):
    """'name version' lines, sorted: a diff's before/after."""
    return "".join("%s %s\n" % (name, versions[name]) for name in sorted(versions))
