"""The vLLM the vllm_install role installs: the version in its venv against the pinned one.

Spec mode, on the hosts where the role runs (not where every instance runs in a container). The version is
read from the venv's package metadata (`importlib.metadata`), without importing vLLM.
"""

import shlex

from provisioner.audit.engine import shown_properties
from provisioner.audit.registry import each


# the venv's vLLM version without importing vllm (slow; the real one may need CUDA)
VLLM_VERSION = """\
import importlib.metadata as metadata
try:
    print(metadata.version("vllm"))
except metadata.PackageNotFoundError:
    print("(not installed)")
    raise SystemExit(3)
"""
# the venvs of role vllm_install: where `current` and `previous` link, every version's venv, the
# unversioned venv of earlier releases; one KEY=VALUE line each (venvs: space-separated folder names)
VLLM_VENVS = ("echo current=$(readlink {current}); echo previous=$(readlink {previous}); "
              "echo venvs=$(ls -1 {venvs} 2>/dev/null | sort -V); [ -d {unversioned} ] && echo unversioned={unversioned}; true")


def commands(expected):
    install = expected.get("vllm_install")
    if not install:
        return {}
    python = shlex.quote(f"{install['venv']}/bin/python")
    return {
        "vllm_version": f"[ -x {python} ] || {{ echo no {python}; exit 4; }}; {python} -c {shlex.quote(VLLM_VERSION)}",
        "vllm_venvs": VLLM_VENVS.format(**{key: shlex.quote(install[key]) for key in ("current", "previous", "venvs", "unversioned")}),
    }


def read(expected, out):
    """The venv's vLLM version (VLLM_VERSION's output and exit status), and VLLM_VENVS: current, previous, venvs, unversioned."""
    return {"vllm_version": out.get("vllm_version"),
            "vllm_venvs": shown_properties(out["vllm_venvs"]) if "vllm_venvs" in out else {}}

installs = each(lambda expected: [expected["vllm_install"]] if expected.get("vllm_install") else [],
                ids=lambda install: install["venv"])


@installs
def vllm_version(case, facts, audit):
    """`vLLM in VENV` — the vLLM version installed in the role's venv against `vllm_install_version` (the spec's `vllm.version`).

    Modes: spec.
    """
    install, read = case.item, facts.vllm_version
    check = f"vLLM in {install['venv']}"
    lines = read.text.strip().splitlines() if read is not None else []
    if read is None or read.rc != 0:
        audit.expect(check, install["version"], f"({lines[-1] if lines else 'unreadable'})", passed=False)
    audit.expect(check, install["version"], lines[-1] if lines else "(no version)")


@installs
def vllm_versions(case, facts, audit):
    """`vLLM versions in PATH` — the venv the units run (`current`) against the pinned version's; any venv but it and the previous one (kept for a rollback) is left over.

    Modes: spec.
    """
    install, read = case.item, facts.vllm_venvs
    name = lambda path: path.rsplit("/", 1)[-1] if path.startswith(install["venvs"] + "/") else path  # noqa: E731
    running, previous = read.get("current", ""), read.get("previous", "")
    kept = {path for path in (running, previous) if path}
    found = [f"{install['venvs']}/{version}" for version in read.get("venvs", "").split()]
    found += [read["unversioned"]] if read.get("unversioned") else []
    actual = [f"{name(running)} running" if running else "none running (no current link)"]
    actual += [f"{name(previous)} previous"] if previous else []
    actual += [f"{name(path)} left over" for path in found if path not in kept]
    audit.expect(f"vLLM versions in {install['path']}", f"{install['version']} running, at most one previous",
                 ", ".join(actual), passed=running == install["venv"] and set(found) <= kept)
