"""The NVIDIA driver against what the host's vLLM needs: the CUDA its wheel is built for decides the driver branch.

Spec mode, on hosts with venv instances: the build is the host's `vllm.version` in its `vllm.cuda` build (the
catalog's, provisioner/vllm/builds.py), its minimum from provisioner/vllm/cuda_drivers.py; the driver is
nvidia-smi's `driver_version`, read with the GPU rows' query.

Where role nvidia_driver manages the driver (`driver:` in the spec, manage true): its package set for the host's
release installed in the branch and held, its module built for every kernel with headers, and loaded.
"""

import shlex

from provisioner.audit.registry import each
from provisioner.base.module_utils import driver_state
from provisioner.gpu import checks as gpu

# role nvidia_driver's: the release, the packages dpkg knows (the module's own format), the driver module's
# version for each kernel DKMS builds for (those with headers: /lib/modules/K/build), the loaded module's
DRIVER_RELEASE = '. /etc/os-release && echo "$VERSION_CODENAME"'
DRIVER_MODULES = ('for dir in /lib/modules/*/; do kernel=$(basename "$dir"); [ -e "$dir/build" ] || continue; '
                  'for module in {modules}; do echo "$kernel $module $(modinfo -k "$kernel" -F version "$module" 2>/dev/null)"; '
                  'done; done')


def commands(expected):
    install = expected.get("driver_install")
    if not install:
        return {}
    modules = sorted({chosen["module"] for chosen in install["sets"].values() if isinstance(chosen, dict)})
    return {
        "driver_release": DRIVER_RELEASE,
        "driver_packages": f"dpkg-query --show --showformat={shlex.quote(driver_state.DPKG_FORMAT)}",
        "driver_modules": DRIVER_MODULES.format(modules=" ".join(map(shlex.quote, modules))),
        "driver_loaded": "cat /sys/module/nvidia/version",
    }


def read(expected, out):
    """Where role nvidia_driver manages the driver: the release codename, {package: {version, want, status}},
    {kernel: {module: version or ""}} for the kernels with headers, the loaded nvidia module's version (None: not loaded)."""
    if "driver_release" not in out:
        return {"driver_release": None, "driver_packages": {}, "driver_modules": {}, "driver_loaded": None}
    modules = {}
    for line in out["driver_modules"].text.splitlines():
        kernel, module, *version = line.split()
        modules.setdefault(kernel, {})[module] = version[0] if version else ""
    return {"driver_release": out["driver_release"].text.strip() or None,
            "driver_packages": driver_state.parse_dpkg_query(out["driver_packages"].text),
            "driver_modules": modules,
            "driver_loaded": out["driver_loaded"].text.strip() if out["driver_loaded"].rc == 0 else None}

needs = each(lambda expected: [expected["driver"]] if expected.get("driver") else [], ids=lambda _: "driver")


@needs
def driver_runs_the_vllm_build(case, facts, audit):
    """`driver ≥ what vLLM VERSION (CUDA X.Y) needs` — the driver nvidia-smi reports against the branch the host's vLLM build needs (≥ 580 for a CUDA 13 build, ≥ 525 for CUDA 12).

    Modes: spec.
    """
    name, minimum = case.item["name"], case.item["minimum"]
    if facts.gpu is None:
        audit.expect(name, f"≥ {minimum}", f"(unreadable: {facts.gpu_problem})", passed=False)
    check = gpu.driver_check(name, facts.gpu.driver_version, minimum)
    audit.expect(check.name, check.expected, check.actual, passed=check.passed)


# --------------------------------------------------------------------------- role nvidia_driver, where it manages the driver

installs = each(lambda expected: [expected["driver_install"]] if expected.get("driver_install") else [],
                ids=lambda _: "driver install")


def host_set(install: dict, facts) -> dict | str:
    """The role's package set for the host's release, or why there is none."""
    return install["sets"].get(facts.driver_release) or f"no package set for {facts.driver_release or 'this release'}"


def installed_driver(install: dict, facts) -> str | None:
    """The upstream version the set's packages are installed at (None: not all at one version)."""
    chosen = host_set(install, facts)
    return driver_state.driver_version(chosen, driver_state.installed_versions(facts.driver_packages)) \
        if isinstance(chosen, dict) else None


@installs
def driver_packages(case, facts, audit):
    """`driver packages: SOURCE BRANCH` — role nvidia_driver's package set for the host's release (its vars/packages.yml, chosen by its module's code): each installed at a version of the branch (the exact version when one is pinned), held when the role holds them.

    Modes: spec.
    """
    install = case.item
    check, chosen = f"driver packages: {install['source']} {install['branch']}", host_set(install, facts)
    at = install["version"] or f"{install['branch']}.*"
    if isinstance(chosen, str):
        audit.expect(check, f"the set of branch {install['branch']}", chosen, passed=False)
    expected = f"{', '.join(chosen['packages'])} at {at}" + (", held" if install["hold"] else ", not held")
    problems = []
    for name in chosen["packages"]:
        package = facts.driver_packages.get(name)
        if package is None or package["status"] != "installed":
            problems.append(f"{name} not installed")
        elif not driver_state.in_branch(package["version"], install["branch"], install["version"]):
            problems.append(f"{name} {package['version']}")
        elif (package["want"] == "hold") != install["hold"]:
            problems.append(f"{name} {'held' if package['want'] == 'hold' else 'not held'}")
    audit.expect(check, expected, "; ".join(problems) or expected)


@installs
def driver_module_built(case, facts, audit):
    """`driver module MODULE` — the set's kernel module (modinfo -k KERNEL) at the installed driver's version for every kernel with headers (DKMS builds for those).

    Modes: spec.
    """
    install = case.item
    chosen = host_set(install, facts)
    if isinstance(chosen, str):
        audit.not_applicable("driver module", "built", chosen)
    module, version = chosen["module"], installed_driver(install, facts)
    check, expected = f"driver module {module}", f"{version or install['branch'] + '.*'} for every kernel with headers"
    built = {kernel: modules.get(module) or "(not built)" for kernel, modules in sorted(facts.driver_modules.items())}
    actual = "; ".join(f"{kernel}: {found}" for kernel, found in built.items()) or "(no kernel headers in /lib/modules)"
    passed = bool(built) and version is not None and all(found == version for found in built.values())
    audit.expect(check, expected, expected if passed else actual, passed=passed)


@installs
def driver_loaded(case, facts, audit):
    """`driver loaded` — the running nvidia module (/sys/module/nvidia/version) is the installed driver; n/a in a container (no kernel of its own) and where no GPU is expected.

    Modes: spec.
    """
    install = case.item
    version = installed_driver(install, facts)
    check, expected = "driver loaded", version or f"{install['branch']}.*"
    if facts.container:
        audit.not_applicable(check, expected, f"a container ({facts.container}) loads no kernel modules")
    if not install["expect_gpus"]:
        audit.not_applicable(check, expected, "no GPU expected: nothing loads the module")
    audit.expect(check, expected, facts.driver_loaded or "(not loaded: a reboot is pending)",
                 passed=version is not None and facts.driver_loaded == version)
