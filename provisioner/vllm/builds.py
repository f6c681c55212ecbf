"""The builds of each supported vLLM version: the CUDA each wheel is built for, and so the driver it needs.

Each catalog (catalogs/vllm-<version>.json) records its builds under `builds`, by variant (`cu130`):
the default build (the wheel PyPI serves), written by `python -m provisioner.vllm.make_catalog` from
the wheels' own metadata in a venv with that vLLM, and other variants recorded by hand with where
they are published (`index_url`, `extra_index_url`) and `"verified": false` until a venv of that
build writes its entry. The driver each build needs: provisioner/vllm/cuda_drivers.py.

Standard library only (`provision facts` lists the builds on the GPU host).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache

from provisioner.vllm.cuda_drivers import DriverRule, rule_for
from provisioner.vllm.flags import CATALOGS_DIR, supported_versions


@dataclass(frozen=True)
class Build:
    """One wheel of a vLLM version."""

    version: str  # the vLLM version, 0.25.0
    variant: str  # cu130, cu129
    cuda: str  # 13.0
    default: bool  # the wheel PyPI serves (what `pip install vllm==<version>` gets)
    verified: bool  # its CUDA read from its own metadata (false: recorded from where it is published)
    index_url: str | None = None  # where another variant is published (pip's --extra-index-url)
    extra_index_url: str | None = None  # the torch of that CUDA (PyTorch's index)

    @property
    def label(self) -> str:
        return f"vLLM {self.version} (CUDA {self.cuda})"

    @property
    def rule(self) -> DriverRule | None:
        return rule_for(self.cuda)

    @property
    def minimum_branch(self) -> int | None:
        rule = self.rule
        return rule.minimum_branch if rule else None


@cache
def builds_of(version: str) -> tuple[Build, ...]:
    """The builds of `version`, the default first; () for a version without a catalog."""
    path = CATALOGS_DIR / f"vllm-{version}.json"
    if not path.is_file():
        return ()
    recorded = json.loads(path.read_text(encoding="utf-8")).get("builds") or {}
    builds = [Build(version, variant, entry["cuda"], bool(entry.get("default")), entry.get("verified", True) is True,
                    entry.get("index_url"), entry.get("extra_index_url"))
              for variant, entry in recorded.items()]
    return tuple(sorted(builds, key=lambda build: (not build.default, build.variant)))


def build_of(version: str, cuda: str | None = None) -> Build | None:
    """The build of `version` for `cuda` (None: the default build); None when there is no such build."""
    return next((build for build in builds_of(version) if (build.default if cuda is None else build.cuda == cuda)), None)


def all_builds() -> list[Build]:
    """Every build of every supported version, in version order."""
    return [build for version in supported_versions() for build in builds_of(version)]


def cuda_choices(version: str) -> str:
    """`13.0 (the default), 12.9`: the builds of `version` as the spec's vllm.cuda takes them."""
    return ", ".join(f"{build.cuda}{' (the default)' if build.default else ''}" for build in builds_of(version))


@dataclass(frozen=True)
class Verdict:
    """Whether a driver runs a build: ok, ok with a known risk (below the advised branch), too old, unknown."""

    build: Build
    minimum: int | None  # the branch it needs; None: the table has no row for its CUDA
    status: str  # ok | risky | too old | unknown
    why: str = ""  # for risky: what can fail; for too old: the fix

    def as_data(self) -> dict:
        return {"version": self.build.version, "cuda": self.build.cuda, "default": self.build.default,
                "verified": self.build.verified, "minimum_driver": None if self.minimum is None else str(self.minimum),
                "ok": self.status in ("ok", "risky"), "status": self.status, "why": self.why}


def verdict(build: Build, branch: int | None) -> Verdict:
    """What a driver of `branch` (None: no driver) says to `build`."""
    rule = build.rule
    if rule is None or branch is None:
        return Verdict(build, rule and rule.minimum_branch, "unknown")
    if branch < rule.minimum_branch:
        fix = f"a driver of branch {rule.minimum_branch} or later"
        other = [other for other in builds_of(build.version) if other != build
                 and other.minimum_branch is not None and other.minimum_branch <= branch]
        if other:
            fix += f", or vLLM {build.version}'s CUDA {other[0].cuda} build (vllm.cuda: \"{other[0].cuda}\")"
        return Verdict(build, rule.minimum_branch, "too old", fix)
    if rule.advised_branch and branch < rule.advised_branch:
        return Verdict(build, rule.minimum_branch, "risky",
                       f"{rule.risk}; branch {rule.advised_branch} or later avoids it")
    return Verdict(build, rule.minimum_branch, "ok")


def verdicts(branch: int | None) -> list[Verdict]:
    """A driver of `branch` against every build of every supported vLLM version."""
    return [verdict(build, branch) for build in all_builds()]
