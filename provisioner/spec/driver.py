"""The NVIDIA driver of a host as the spec says it: the vLLM builds the host's instances run (their CUDA,
so the driver branch they need), the kernel modules its GPUs take, and pass 2's checks of `driver:` and
`vllm.cuda`.

A venv instance runs the host's `vllm.version` in the build `vllm.cuda` names (null: the default build);
a container instance the image its tag names (`v<version>`: that version's default build, as the
project's images are built from the default wheel; a tag naming no supported version is not checked).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from provisioner.base.module_utils import value_rules
from provisioner.gpu.architectures import needs_open_modules, older_than_turing
from provisioner.spec.errors import Problem
from provisioner.spec.models import Container, DriverSettings, Host, Instance
from provisioner.spec.parts import SpecParts, present
from provisioner.vllm.builds import Build, build_of, builds_of, cuda_choices
from provisioner.vllm.cuda_drivers import branch_of
from provisioner.vllm.flags import supported_versions

TAG_VERSION = re.compile(r"^v?([0-9]+\.[0-9]+\.[0-9]+)(?![0-9.])")


@dataclass(frozen=True)
class BuildUse:
    """A vLLM build a host runs, and the instances that run it."""

    build: Build
    instances: tuple[str, ...]
    image: str | None = None  # a container image (name:tag) the build was told from; None: the host's venv

    @property
    def minimum_branch(self) -> int | None:
        return self.build.minimum_branch


def image_of(host: Host, container: Container) -> str:
    """name:tag of a container instance's image (the tag: v<the host's vllm.version> unless given)."""
    return f"{container.image}:{container.tag or 'v' + host.vllm.version}"


def image_version(host: Host, container: Container) -> str | None:
    """The vLLM version a container's tag names (v0.25.0 → 0.25.0); None: it names none."""
    match = TAG_VERSION.match(container.tag or "v" + host.vllm.version)
    return match.group(1) if match else None


def builds_used(host: Host, instances: list[Instance]) -> list[BuildUse]:
    """Each vLLM build the host's instances run, the venv's first, then each container image's."""
    uses: list[BuildUse] = []
    venv = tuple(instance.name for instance in instances if instance.container is None)
    build = build_of(host.vllm.version, host.vllm.cuda)
    if venv and build is not None:
        uses.append(BuildUse(build, venv))
    images: dict[str, list[str]] = {}
    for instance in instances:
        if instance.container is not None:
            images.setdefault(image_of(host, instance.container), []).append(instance.name)
    for image, names in images.items():
        container = next(i.container for i in instances if i.name == names[0])
        version = image_version(host, container)
        build = build_of(version) if version else None
        if build is not None:
            uses.append(BuildUse(build, tuple(names), image))
    return uses


def unchecked_images(host: Host, instances: list[Instance]) -> dict[str, list[str]]:
    """The container images whose tag names no supported vLLM version (their driver need is unknown), with
    their instances."""
    unknown: dict[str, list[str]] = {}
    for instance in instances:
        container = instance.container
        if container is not None:
            version = image_version(host, container)
            if version is None or build_of(version) is None:
                unknown.setdefault(image_of(host, container), []).append(instance.name)
    return unknown


def minimum_branch(uses: list[BuildUse]) -> int | None:
    """The driver branch every build in `uses` runs on; None: none of them says."""
    floors = [use.minimum_branch for use in uses if use.minimum_branch is not None]
    return max(floors) if floors else None


def venv_minimum_branch(host: Host, instances: list[Instance]) -> int | None:
    """The branch the host's venv build needs (role vllm_install's guard); None without venv instances."""
    return minimum_branch([use for use in builds_used(host, instances) if use.image is None])


def resolved_modules(host: Host) -> str:
    """The kernel modules the driver is installed with: the spec's, or for auto (and no section) open unless
    a GPU of the host is older than Turing."""
    chosen = host.driver.modules if host.driver is not None else "auto"
    if chosen != "auto":
        return chosen
    return "proprietary" if any(older_than_turing(device.model) for device in host.gpus.devices) else "open"


def settings_of(host: Host) -> DriverSettings:
    """The host's driver section, or the defaults a section would have (for a host without one)."""
    return host.driver if host.driver is not None else DriverSettings()


# --------------------------------------------------------------------------- pass 2


def driver_problems(parts: SpecParts) -> list[Problem]:
    """A managed driver's version in its branch, and kernel modules that run the host's GPUs."""
    problems = []
    for index, host in present(parts.hosts):
        driver = host.driver
        if driver is None or not driver.manage:
            continue
        where = f"hosts[{index}].driver"
        off_branch = driver.version and value_rules.driver_version_problem(driver.version, driver.branch)
        if off_branch:
            problems.append(Problem(f"{where}.version",
                                    f"{off_branch}, or set branch: \"{branch_of(driver.version)}\""))
        message = _modules_problem(host, driver.modules)
        if message:
            problems.append(Problem(f"{where}.modules", message))
    return problems


def _modules_problem(host: Host, modules: str) -> str | None:
    """Why the kernel modules `modules` cannot run one of the host's GPUs; None when they can."""
    def named(device) -> str:
        return f"GPU {device.index} ({device.model})"

    old = [device for device in host.gpus.devices if older_than_turing(device.model)]
    new = [device for device in host.gpus.devices if needs_open_modules(device.model)]
    if modules == "proprietary" and new:
        return (f"{named(new[0])} is a Blackwell-generation GPU, which only the open kernel modules run — use "
                "modules: open, or auto")
    if modules == "open" and old:
        return (f"{named(old[0])} is older than Turing, which only the proprietary kernel modules run — use "
                "modules: proprietary, or auto")
    if modules == "auto" and old and new:
        return (f"{named(old[0])} runs only on the proprietary kernel modules and {named(new[0])} only on the "
                "open ones — no driver runs both: give them to different hosts")
    return None


def cuda_problems(parts: SpecParts) -> list[Problem]:
    """`vllm.cuda` names a build of the host's vLLM version, one the host can install (not from PyPI)."""
    problems = []
    supported = supported_versions()
    for index, host in present(parts.hosts):
        vllm = host.vllm
        if vllm.cuda is None or vllm.version not in supported:
            continue  # the default build; an unsupported version is reported on vllm.version
        build = build_of(vllm.version, vllm.cuda)
        where = f"hosts[{index}].vllm.cuda"
        if build is None:
            problems.append(Problem(where, f"vLLM {vllm.version} has no CUDA {vllm.cuda} build — use one of "
                                           f"{cuda_choices(vllm.version)}, or null for the default"))
        elif not build.default and not vllm.wheelhouse and not vllm.index_url:
            default = builds_of(vllm.version)[0]
            published = f" (published at {build.index_url})" if build.index_url else ""
            problems.append(Problem(where, (
                f"vLLM {vllm.version}'s CUDA {vllm.cuda} build is not the wheel PyPI serves (that one is CUDA "
                f"{default.cuda}) — set vllm.wheelhouse to a folder with its wheels, or vllm.index_url to an "
                f"index that serves it{published}")))
    return problems
