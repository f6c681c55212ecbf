"""docs/audit-checks.md lists exactly the checks the registry has: every check describes its rows and
modes in its docstring, the page is what provisioner/audit/check_docs.py generates from them, and each
check's `Modes:` line is where it really runs (its cases under spec-mode and profile-mode expectations).

After adding or changing a check, regenerate the page with
    .venv/bin/python -m provisioner.audit.check_docs
"""

from __future__ import annotations

from functools import cache

import pytest

from provisioner.audit.check_docs import DOCS_PAGE, FORM, REGENERATE, generated_page, read_checks
from provisioner.audit.expectations import load_profile, profile_expectations, spec_targets
from provisioner.audit.registry import make_check
from provisioner.base.paths import EXAMPLES_DIR
from provisioner.spec import load_spec, validate_spec
from tests.unit.conftest import UUID0, UUID1, host, instance, spec_data


def test_every_check_has_the_docstring_form():
    _, problems = read_checks()
    assert problems == [], (
        f"every check's docstring starts with {FORM}:\n  " + "\n  ".join(problems))


def test_the_page_is_what_the_registry_generates():
    text, problems = generated_page()
    assert problems == []
    assert DOCS_PAGE.read_text(encoding="utf-8") == text, (
        f"docs/audit-checks.md differs from the registry's checks — regenerate it: {REGENERATE}")


def test_the_page_has_a_section_per_concern_and_a_row_per_check():
    sections, _ = read_checks()
    page = DOCS_PAGE.read_text(encoding="utf-8")
    assert {"discovered", "gpu", "nouveau", "shm", "sysctl", "vllm container", "vllm service"} <= {
        section.title for section in sections}
    for section in sections:
        assert f"\n## {section.title}\n" in page
    rows = [line for line in page.splitlines() if line.startswith("| `")]
    assert len(rows) == sum(len(section.checks) for section in sections)
    assert "| `sysctl live: KEY` | the kernel's value in /proc/sys; n/a in a container" in page
    assert "nouveau module" not in page  # the row docs/audit.md once listed and no check reports


def no_docstring(case, audit):
    pass


def old_style(case, audit):
    """Compares something."""


def no_modes(case, audit):
    """`ROW` — compares a thing."""


def unknown_mode(case, audit):
    """`ROW` — compares a thing.

    Modes: spec, lab.
    """


def good(case, audit):
    """`KEY: ROW` or `KEY: OTHER` — compares a thing.

    Modes: profile.
    """


def test_a_check_without_the_form_is_named_with_what_is_wrong():
    problems = [make_check(function).problem for function in (no_docstring, old_style, no_modes, unknown_mode)]
    assert "no docstring" in problems[0] and "'Compares something.'" in problems[1]
    assert "no 'Modes: …' line" in problems[2] and "other than spec, profile" in problems[3]
    found = make_check(good)
    assert (found.problem, found.rows, found.compares, found.modes) == (None, ("KEY: ROW", "KEY: OTHER"), "compares a thing.",
                                                                       ("profile",))


# --------------------------------------------------------------------------- modes: where each check has cases

TWO_GPUS = {"devices": [{"index": 0, "uuid": UUID0}, {"index": 1, "uuid": UUID1}]}


def containers_spec() -> dict:
    """One podman and one docker instance (their checks run only where the spec has containers), with NVIDIA's
    container toolkit managed (its checks run only there)."""
    return spec_data(hosts=[host(gpus=TWO_GPUS, container_toolkit={"version": "1.18.0-1"})], instances=[
        instance("pod", 8000, 0.45, gpus=[0, 1], options={"tensor-parallel-size": 2},
                 container={"engine": "podman", "shm_size": "16G"}),
        instance("dock", 8001, 0.45, gpus=[1], container={"engine": "docker", "digest": "sha256:" + "0f" * 32,
                                                          "ipc_host": True}),
    ])


def no_nouveau_blacklist_spec() -> dict:
    """nouveau_blacklist off: the role removes its files (the "absent" checks)."""
    return spec_data(hosts=[host(settings={"nouveau_blacklist": False})])


def gateway_spec() -> dict:
    """A gateway in front of the instance (role gateway's checks)."""
    return {**spec_data(instances=[instance("chat", 8000, bind="0.0.0.0")]),
            "gateways": [{"name": "public", "host": "ws4070", "port": 8080}]}


def monitoring_spec() -> dict:
    """Prometheus on the GPU host itself (roles node_exporter's and prometheus's checks)."""
    return {**spec_data(), "monitoring": {"host": "ws4070"}}


def multinode_spec() -> dict:
    """One instance across two hosts (the nodes' group row)."""
    return spec_data(hosts=[host("ws4070"), host("ws4071", "192.0.2.21", gpus={"devices": [
        {"index": 0, "uuid": UUID1, "model": "NVIDIA GeForce RTX 4070"}]})], instances=[
        instance("big", 8000, 0.5, options={"pipeline-parallel-size": 2},
                 multinode={"followers": [{"host": "ws4071", "gpus": [0]}]})])


def managed_driver_spec() -> dict:
    """A driver the roles install (role nvidia_driver's checks)."""
    return spec_data(hosts=[host(driver={"source": "nvidia", "branch": "580"})])


# what discovery returns for a server with a vLLM unit, a vLLM container, a vLLM started from a shell
# (a bare process) and two GPUs, the bare process holding memory on GPU 0
BARE_ARGV = ["/opt/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "m", "--host", "0.0.0.0"]
DISCOVERED = {
    "units": [{"name": "llm.service", "fragment": "/etc/systemd/system/llm.service",
               "argv": ["/usr/bin/vllm", "serve", "m", "--port", "8100"]}],
    "gpus": {"indexes": [0, 1], "problem": None},
    "container_tools": ["docker"],
    "containers": [{"name": "v", "tool": "docker", "image": "vllm/vllm-openai", "ports": [], "shm_bytes": 67108864,
                    "argv": ["vllm", "serve", "m"], "environment": {"CUDA_VISIBLE_DEVICES": "0"}}],
    "servers": [{"name": "process 4242", "kind": "process", "pid": 4242, "user": "root", "uid": 0, "cmdline": BARE_ARGV,
                 "supervision": {"kind": "session", "name": "session-3.scope", "cgroup": "/user.slice/session-3.scope"},
                 "via": ["nohup"], "environment": {"CUDA_VISIBLE_DEVICES": "0"}, "shm_bytes": 67108864,
                 "host_shm": True, "host_ipc": True, "gpus": [{"index": 0, "uuid": UUID0, "mib": 20000}]}],
    "gpu_cards": [{"index": 0, "uuid": UUID0, "used_mib": 20000, "total_mib": 24576,
                   "apps": [{"pid": 4242, "server": "process 4242", "mib": 20000, "comm": "python"}]}],
}


@cache
def samples() -> dict[str, list[dict]]:
    """Expectations each mode builds, rich enough that every check has cases in the modes it runs in:
    spec mode of the example specs and of specs with containers and with nouveau left alone; profile
    mode of the recommended profile over a discovered server. A new check whose cases need something
    these lack: add it here (a spec, or what discovery finds)."""
    specs = [load_spec(path) for path in sorted(EXAMPLES_DIR.glob("*.yml"))]
    specs += [validate_spec(data, check_files=False) for data in (containers_spec(), no_nouveau_blacklist_spec(),
                                                                         gateway_spec(), managed_driver_spec(),
                                                                         monitoring_spec(), multinode_spec())]
    return {
        "spec": [target.expected for spec in specs for target in spec_targets(spec)],
        "profile": [profile_expectations(load_profile("recommended"), DISCOVERED)],
    }


def documented_checks():
    sections, _ = read_checks()
    return [check for section in sections for check in section.checks]


@pytest.mark.parametrize("check", documented_checks(), ids=lambda check: f"{check.concern}.{check.name}")
def test_each_check_runs_in_exactly_the_modes_its_docstring_names(check):
    runs_in = tuple(mode for mode, expectations in samples().items()
                    if any(check.cases("h", expected) for expected in expectations))
    assert runs_in == check.modes, (
        f"{check.concern}.py {check.name}: its docstring says 'Modes: {', '.join(check.modes)}.', its cases "
        f"come in {', '.join(runs_in) or 'no mode'} (with the samples in tests/unit/test_audit_check_docs.py)")


def test_the_samples_give_each_mode_what_its_checks_read():
    spec, profile = samples()["spec"], samples()["profile"]
    assert any(expected["vllm_containers"] for expected in spec) and any(expected["units"] for expected in spec)
    assert any(expected["nouveau"].get("absent_files") for expected in spec)
    assert profile[0]["containers"]["found"] and profile[0]["units"] and profile[0]["gpu"]
    assert profile[0].get("servers") and profile[0].get("gpu_cards")
