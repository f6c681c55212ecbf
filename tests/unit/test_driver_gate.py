"""The driver gate: a host whose NVIDIA driver is older than its vLLM build needs is refused by `plan` and
`apply` before any host is touched, with the fix — word for word; the driver read on a host; the builds'
data in the catalogs; `provision facts` (the driver and the newest CUDA it supports); the audit's row."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from provisioner.apply.hosts import apply_spec
from provisioner.audit.checks import nvidia_driver
from provisioner.audit.checks.gpu import parse_gpu
from provisioner.audit.engine import Output, host_commands
from provisioner.audit.expectations import spec_targets
from provisioner.audit.registry import Audit, Case, Drift, NotApplicable
from provisioner.base.paths import EXAMPLES_DIR
from provisioner.cli.main import app
from provisioner.fleet.inventory import host_vars
from provisioner.fleet.remote import RemoteError
from provisioner.gpu.facts import read_facts, smi_facts
from provisioner.gpu.smi import parse_cuda_version, query_arguments
from provisioner.spec import SpecError, load_spec, validate_spec
from provisioner.validation.preflight import (
    READ_DRIVER,
    GateProblem,
    KnownDriver,
    PreflightError,
    driver_check,
    parse_driver_reading,
)
from provisioner.vllm import builds, cuda_drivers, make_catalog
from tests.unit.conftest import UUID0, UUID1, host, instance, spec_data, write_spec

GPU_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gpu"
RECORDED = GPU_FIXTURES / "h200-driver"
DEBIAN = "Debian's own packages stop at 535 on bookworm and 550 on trixie"
CU129 = 'or install vLLM 0.25.0\'s CUDA 12.9 build: vllm.cuda: "12.9" (https://wheels.vllm.ai/0.25.0/cu129)'
TOO_OLD_MANAGED = ('ws4070: driver 535 (driver.branch) is too old for vLLM 0.25.0 (CUDA 13.0), which needs driver '
                   f'≥ 580 — set driver.branch: "580" with source: nvidia ({DEBIAN}), {CU129}')
TOO_OLD_DECLARED = ('ws4070: driver 550.163.01 (driver.version) is too old for vLLM 0.25.0 (CUDA 13.0), which needs '
                    'driver ≥ 580 — install a driver of branch 580 or later, or let apply do it: driver: {source: '
                    f'nvidia, branch: "580"}} ({DEBIAN}), {CU129}')


FITS = {"max-model-len": 4096}  # fits the RTX 4070 of the builders' host: only the driver is in question


def fitting(name: str = "chat", port: int = 8000, **fields) -> dict:
    return instance(name, port, options=FITS, **fields)


def invoke(*args):
    return CliRunner().invoke(app, [str(arg) for arg in args], env={"NO_COLOR": "1", "PROVISION_SPEC": ""})


def checked(driver=None, vllm=None, instances=None, **host_fields):
    data = spec_data(hosts=[host(**({"driver": driver} if driver is not None else {}),
                                 **({"vllm": vllm} if vllm else {}), **host_fields)],
                     instances=[fitting()] if instances is None else instances)
    spec = validate_spec(data, check_files=False)
    return spec, driver_check(spec.hosts[0], list(spec.instances))


# --------------------------------------------------------------------------- the verdicts, word for word


def test_a_managed_branch_below_the_build_is_refused_with_both_fixes():
    _, check = checked(driver={"source": "distribution", "branch": "535"})
    assert check.problems == (TOO_OLD_MANAGED,)
    assert check.notes == ("driver 535 (driver.branch) — vLLM 0.25.0 (CUDA 13.0) needs ≥ 580",)


def test_a_declared_driver_below_the_build_is_refused_with_the_install_fix():
    _, check = checked(driver={"manage": False, "version": "550.163.01"})
    assert check.problems == (TOO_OLD_DECLARED,)


def test_a_driver_below_every_build_gets_only_the_driver_fix():
    _, check = checked(driver={"manage": False, "version": "470.256.02"})
    assert check.problems == (
        'ws4070: driver 470.256.02 (driver.version) is too old for vLLM 0.25.0 (CUDA 13.0), which needs driver ≥ 580 '
        '— install a driver of branch 580 or later, or let apply do it: driver: {source: nvidia, branch: "580"} '
        f'({DEBIAN})',)


def test_a_cuda_12_build_on_525_to_574_runs_with_a_warning():
    _, check = checked(driver={"branch": "550", "source": "distribution"},
                       vllm={"cuda": "12.9", "index_url": "https://mirror.example/simple"})
    assert check.problems == ()
    assert check.warnings == (
        'driver 550 (driver.branch) runs vLLM 0.25.0 (CUDA 12.9) only through CUDA minor-version compatibility, '
        'where kernels JIT-compiled from PTX can fail ("the provided PTX was compiled with an unsupported '
        'toolchain", vllm#31700) — a driver of branch 575 or later avoids it',)
    _, check = checked(driver={"branch": "575"}, vllm={"cuda": "12.9", "index_url": "https://mirror.example/simple"})
    assert (check.problems, check.warnings) == ((), ())


def test_a_cuda_12_build_below_525_is_refused():
    _, check = checked(driver={"manage": False, "version": "470.256.02"},
                       vllm={"cuda": "12.9", "index_url": "https://mirror.example/simple"})
    assert check.problems == (
        'ws4070: driver 470.256.02 (driver.version) is too old for vLLM 0.25.0 (CUDA 12.9), which needs driver ≥ 525 '
        '— install a driver of branch 525 or later, or let apply do it: driver: {source: nvidia, branch: "525"} '
        f'({DEBIAN})',)


def test_a_container_is_checked_by_its_image_tags_version():
    _, check = checked(driver={"branch": "535"}, instances=[instance("pod", 8000, container={"engine": "podman"})])
    assert check.problems == (
        'ws4070: driver 535 (driver.branch) is too old for the image docker.io/vllm/vllm-openai:v0.25.0 of pod '
        '(vLLM 0.25.0, CUDA 13.0), which needs driver ≥ 580 — set driver.branch: "580" with source: nvidia '
        f'({DEBIAN})',)
    _, check = checked(driver={"branch": "535"},
                       instances=[instance("pod", 8000, container={"engine": "podman", "tag": "nightly"})])
    assert (check.problems, check.notes) == ((), (
        "the image docker.io/vllm/vllm-openai:nightly of pod names no vLLM version this tool knows: the driver it "
        "needs is not checked",))


def test_plan_says_an_undeclared_driver_is_read_at_apply_and_a_host_without_instances_needs_nothing():
    _, check = checked()
    assert (check.problems, check.notes) == ((), (
        "driver not declared: apply reads it from the host — vLLM 0.25.0 (CUDA 13.0) needs ≥ 580",))
    _, check = checked(driver={"branch": "470"}, instances=[])
    assert (check.problems, check.notes, check.needs) == ((), (), ())


def test_a_distribution_driver_above_what_debian_packages_is_a_warning():
    _, check = checked(driver={"source": "distribution", "branch": "580"})
    assert check.warnings == (
        "driver.source distribution with branch 580: Debian's own packages stop at 535 on bookworm and 550 on "
        "trixie — on Debian use source: nvidia (Ubuntu's own archive has newer branches)",)


def test_what_apply_read_is_judged_as_a_declared_driver():
    spec, _ = checked()
    read = parse_driver_reading("nvidia-smi 550.163.01\n")
    assert driver_check(spec.hosts[0], list(spec.instances), read).problems == (
        'ws4070: driver 550.163.01 (read from the host: nvidia-smi) is too old for vLLM 0.25.0 (CUDA 13.0), which '
        'needs driver ≥ 580 — install a driver of branch 580 or later, or let apply do it: driver: {source: nvidia, '
        f'branch: "580"}} ({DEBIAN}), {CU129}',)
    assert driver_check(spec.hosts[0], list(spec.instances), None).problems == (
        'ws4070: no NVIDIA driver found (no nvidia module loaded or installed, no nvidia-smi) — vLLM 0.25.0 (CUDA '
        '13.0) needs ≥ 580: install one, or let apply do it: driver: {source: nvidia, branch: "580"}',)


# --------------------------------------------------------------------------- plan and apply refuse, touching no host


def test_plan_refuses_a_declared_driver_too_old_and_says_why(tmp_path):
    spec = write_spec(tmp_path / "spec.yml", spec_data(hosts=[host(driver={"manage": False, "version": "550.163.01"})],
                                                       instances=[fitting()]))
    result = invoke("plan", "--spec", spec)
    assert result.exit_code == 1, result.output
    lines = result.output.splitlines()
    assert "driver 550.163.01 (driver.version) — vLLM 0.25.0 (CUDA 13.0) needs ≥ 580" in lines
    assert lines[-1] == f"driver: {TOO_OLD_DECLARED}"
    planned = json.loads(invoke("plan", "--json", "--spec", spec).output)
    assert [(problem["field"], f"{problem['message']} — {problem['fix']}") for problem in planned["problems"]] == [
        ("hosts[0].driver.version", TOO_OLD_DECLARED)]


def test_plan_of_the_examples_passes_and_notes_the_read(tmp_path):
    result = invoke("plan", "--spec", EXAMPLES_DIR / "seed1-3090.yml")
    assert result.exit_code == 0, result.output
    assert "driver not declared: apply reads it from the host — vLLM 0.25.0 (CUDA 13.0) needs ≥ 580" in result.output


def test_apply_refuses_a_declared_driver_before_any_host_is_touched(tmp_path):
    """The host's address is a TEST-NET one nobody answers: the refusal comes before the host-key scan."""
    spec = write_spec(tmp_path / "spec.yml", spec_data(hosts=[host(driver={"source": "distribution", "branch": "535"})],
                                                       instances=[fitting()]))
    result = invoke("apply", "--spec", spec)
    assert result.exit_code == 1, result.output
    assert result.output.splitlines() == [
        f"driver: {TOO_OLD_MANAGED}",
        "nothing applied: fix the driver or the spec (`provision plan` shows what each host needs)",
    ]


def test_apply_refuses_a_driver_too_old_before_it_loads_ansible(tmp_path, monkeypatch):
    """Loading Ansible's configuration makes ~/.ansible/tmp: a refused spec must write nothing (issue 34)."""
    loaded = []
    monkeypatch.setattr("provisioner.apply.hosts.ansible_environment", lambda *args: loaded.append(args))
    spec = write_spec(tmp_path / "spec.yml", spec_data(hosts=[host(driver={"source": "distribution", "branch": "535"})],
                                                       instances=[fitting()]))
    assert invoke("apply", "--spec", spec).exit_code == 1
    assert loaded == []


def test_apply_names_memory_and_driver_problems_together(tmp_path):
    spec = write_spec(tmp_path / "spec.yml", spec_data(
        hosts=[host(driver={"source": "distribution", "branch": "535"})],
        instances=[instance("chat", 8000, 0.9, model="Qwen/Qwen2.5-7B-Instruct", options={"max-model-len": 32768})]))
    lines = invoke("apply", "--spec", spec).output.splitlines()
    assert list(dict.fromkeys(line.split(":")[0] for line in lines)) == ["memory", "driver", "nothing applied"]
    assert lines[-1] == "nothing applied: fix the driver or the spec (`provision plan` shows what each host needs)"


def trust_every_key(monkeypatch):
    """No host can exist here: the host-key check passes every host, so apply goes on to read the driver."""
    monkeypatch.setattr("provisioner.apply.hosts.check_hosts",
                        lambda endpoints: {endpoint.host: SimpleNamespace(refused=False) for endpoint in endpoints})


def test_apply_reads_an_undeclared_driver_and_refuses_one_too_old_before_the_playbook(monkeypatch):
    trust_every_key(monkeypatch)
    spec = validate_spec(spec_data(hosts=[host(), host("idle", "192.0.2.21", gpus={}),
                                          host("managed", "192.0.2.22", gpus={}, driver={"branch": "580"})],
                                   instances=[fitting(), fitting("other", on="managed", gpus=[UUID1])]),
                         check_files=False)
    asked, said = [], []

    def read(host, spec_path):
        asked.append(host.name)
        return KnownDriver("550.163.01", "read from the host: nvidia-smi")

    with pytest.raises(PreflightError) as refused:
        apply_spec(spec, read_driver=read, on_result=said.append)
    assert asked == ["ws4070"]  # not the host without instances, not the managed one
    assert refused.value.problems == [GateProblem("driver", (
        'ws4070: driver 550.163.01 (read from the host: nvidia-smi) is too old for vLLM 0.25.0 (CUDA 13.0), which '
        'needs driver ≥ 580 — install a driver of branch 580 or later, or let apply do it: driver: {source: nvidia, '
        f'branch: "580"}} ({DEBIAN}), {CU129}'), "hosts[0].driver")]
    assert [(task.host, task.task, task.status, task.notes) for task in said] == [
        ("ws4070", "read the NVIDIA driver", "ok",
         ["driver 550.163.01 (read from the host: nvidia-smi) — vLLM 0.25.0 (CUDA 13.0) needs ≥ 580"])]


def test_apply_reports_a_host_whose_driver_cannot_be_read_as_unreachable(monkeypatch):
    trust_every_key(monkeypatch)
    spec = validate_spec(spec_data(instances=[fitting()]), check_files=False)

    def read(host, spec_path):
        raise RemoteError("ws4070: `PATH=…` exited 255: ssh: connect to host 192.0.2.20 port 22: Connection refused")

    result = apply_spec(spec, read_driver=read)
    assert result.rc == 1 and result.stats["ws4070"].unreachable == 1
    (problem,) = result.problems
    assert (problem.task, problem.status) == ("read the NVIDIA driver", "unreachable")
    assert problem.message.endswith("Connection refused")


# --------------------------------------------------------------------------- reading the driver on a host


def run_read(tmp_path, nvidia_smi: str | None) -> str:
    """READ_DRIVER with PATH holding only a stand-in nvidia-smi (or none) and the tools it calls."""
    folder = tmp_path / "bin"
    folder.mkdir(parents=True)
    for tool in ("cat", "grep"):
        (folder / tool).symlink_to(subprocess.run(["bash", "-c", f"command -v {tool}"], capture_output=True,
                                                  text=True).stdout.strip())
    if nvidia_smi is not None:
        (folder / "nvidia-smi").write_text(f"#!/bin/bash\nprintf '%s\\n' {nvidia_smi!r}\n")
        (folder / "nvidia-smi").chmod(0o755)
    script = READ_DRIVER.replace('PATH="$PATH:/usr/sbin:/sbin"', f'PATH="{folder}"')
    bash = subprocess.run(["bash", "-c", "command -v bash"], capture_output=True, text=True).stdout.strip()
    return subprocess.run([bash, "-c", script], capture_output=True, text=True, env={"PATH": str(folder)}).stdout


@pytest.mark.skipif(os.path.exists("/sys/module/nvidia/version"), reason="this machine has the nvidia module loaded")
def test_the_read_takes_nvidia_smi_where_no_module_is_loaded_and_says_none_without_a_driver(tmp_path):
    assert run_read(tmp_path, "580.159.04") == "nvidia-smi 580.159.04\n"
    assert parse_driver_reading(run_read(tmp_path / "2", None)) is None
    failing = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    assert run_read(tmp_path / "3", failing) == "none\n"


def test_the_readings_as_recorded_on_a_real_h200():
    loaded = parse_driver_reading("loaded " + (RECORDED / "sys-module-nvidia-version.txt").read_text())
    assert loaded == KnownDriver("580.159.04", "read from the host: the loaded module")
    assert parse_driver_reading("installed 535.309.01\n").source == "read from the host: installed, not loaded"
    assert parse_driver_reading("none\n") is None and parse_driver_reading("") is None


# --------------------------------------------------------------------------- the builds and the table


@pytest.mark.parametrize("version", ["0.25.0", "0.33.0"])
def test_each_catalog_has_one_default_build_and_every_build_has_a_row_of_the_table(version):
    recorded = builds.builds_of(version)
    assert [build.default for build in recorded].count(True) == 1 and recorded[0].default
    assert all(build.rule is not None for build in recorded)
    assert recorded[0].cuda == "13.0" and recorded[0].minimum_branch == 580


@pytest.mark.parametrize("version", ["0.25.0", "0.33.0"])
def test_each_build_says_where_its_cuda_comes_from(version):
    catalog = json.loads((builds.CATALOGS_DIR / f"vllm-{version}.json").read_text())
    for variant, entry in catalog["builds"].items():
        if entry.get("verified", True):
            assert any(f"torch=={entry['torch'].split('+')[0]}" in line for line in entry["evidence"]), variant
            assert any("cuda" in line.lower() and entry["cuda"] in line for line in entry["evidence"]), variant
        else:  # recorded from where it is published: the indexes and the sources that name them
            assert entry["index_url"] == f"https://wheels.vllm.ai/{version}/cu129" and entry["sources"], variant
        assert entry["generated"] or entry.get("recorded") or not entry.get("verified", True), variant


def test_the_0_25_0_default_build_was_written_by_make_catalog_from_the_wheels_metadata():
    entry = json.loads((builds.CATALOGS_DIR / "vllm-0.25.0.json").read_text())["builds"]["cu130"]
    assert entry["generated"] is True and entry["torch"] == "2.11.0+cu130"
    assert entry["evidence"][0] == "vllm 0.25.0 METADATA: Requires-Dist: torch==2.11.0"
    assert entry["evidence"][-1] == "torch.version.cuda = '13.0' (torch.__version__ = '2.11.0+cu130')"


def test_writing_a_catalog_again_keeps_the_builds_recorded_by_hand():
    previous = {"builds": {"cu129": {"cuda": "12.9", "default": False, "verified": False},
                           "cu130": {"cuda": "13.0", "default": True, "generated": True}}}
    merged = make_catalog.merged_builds(previous, "cu130", {"cuda": "13.0", "default": True, "generated": True, "x": 1})
    assert merged == {"cu129": previous["builds"]["cu129"], "cu130": {"cuda": "13.0", "default": True,
                                                                      "generated": True, "x": 1}}
    # a cu129 venv writes its own, verified entry over the hand-recorded one
    merged = make_catalog.merged_builds(previous, "cu129", {"cuda": "12.9", "default": False, "generated": True})
    assert merged["cu129"] == {"cuda": "12.9", "default": False, "generated": True}


def test_the_table_cites_nvidias_compatibility_table_on_every_row():
    assert sorted(cuda_drivers.RULES) == [12, 13]
    for rule in cuda_drivers.RULES.values():
        assert any("docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html" in source
                   for source in rule.sources)
    assert (cuda_drivers.RULES[13].minimum_branch, cuda_drivers.RULES[12].minimum_branch) == (580, 525)
    assert cuda_drivers.RULES[12].advised_branch == 575 and "vllm#31700" in cuda_drivers.RULES[12].risk
    assert [cuda_drivers.branch_of(text) for text in ("580.159.04", "550.120", "580", "x")] == [580, 550, 580, None]


# --------------------------------------------------------------------------- provision facts


def test_nvidia_smi_q_tells_the_cuda_version_as_recorded_on_an_h200():
    assert parse_cuda_version((RECORDED / "nvidia-smi-q.txt").read_text()) == "13.0"
    assert parse_cuda_version((RECORDED / "nvidia-smi-version.txt").read_text()) == "13.0"
    assert parse_cuda_version((GPU_FIXTURES / "h200x1" / "query-gpu.csv").read_text()) is None


def test_facts_through_nvidia_smi_have_the_cuda_version_of_nvidia_smi_q():
    answers = {tuple(query_arguments()): (GPU_FIXTURES / "h200x1" / "query-gpu.csv").read_text(),
               ("-q",): (RECORDED / "nvidia-smi-q.txt").read_text()}
    data = smi_facts(lambda arguments: answers[tuple(arguments)])
    assert (data["source"], data["driver_version"], data["cuda_version"]) == ("nvidia-smi", "580.159.04", "13.0")


def test_facts_show_the_driver_and_what_it_runs():
    result = CliRunner().invoke(app, ["facts", "--from-recording", str(GPU_FIXTURES / "h200x1" / "nvml.json")])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[:5] == [
        "NVIDIA driver 580.159.04, CUDA 13.0 — 1 GPU (read through NVML)",
        "vLLM 0.25.0 (CUDA 13.0): needs ≥ 580 — ok",
        "vLLM 0.25.0 (CUDA 12.9, not verified): needs ≥ 525 — ok",
        "vLLM 0.33.0 (CUDA 13.0): needs ≥ 580 — ok",
        "vLLM 0.33.0 (CUDA 12.9, not verified): needs ≥ 525 — ok",
    ]


def test_facts_json_has_the_branch_and_a_verdict_per_build(tmp_path):
    recording = json.loads((GPU_FIXTURES / "h200x1" / "nvml.json").read_text())
    recording["calls"]["nvmlSystemGetDriverVersion()"] = {"value": "550.163.01"}  # an older driver, else as recorded
    older = tmp_path / "nvml.json"
    older.write_text(json.dumps(recording))
    data = json.loads(CliRunner().invoke(app, ["facts", "--json", "--from-recording", str(older)]).output)
    assert data["driver_branch"] == 550
    assert [(build["version"], build["cuda"], build["minimum_driver"], build["ok"], build["status"])
            for build in data["vllm_builds"]] == [
        ("0.25.0", "13.0", "580", False, "too old"), ("0.25.0", "12.9", "525", True, "risky"),
        ("0.33.0", "13.0", "580", False, "too old"), ("0.33.0", "12.9", "525", True, "risky")]
    assert data["vllm_builds"][0]["why"] == ('a driver of branch 580 or later, or vLLM 0.25.0\'s CUDA 12.9 build '
                                            '(vllm.cuda: "12.9")')
    assert {key: data[key] for key in ("driver_version", "cuda_version")} == {
        "driver_version": "550.163.01", "cuda_version": read_facts(recording=older).cuda_version}


# --------------------------------------------------------------------------- the audit's row


def driver_row():
    return nvidia_driver.driver_runs_the_vllm_build


def run_row(expected: dict, query_csv: str):
    facts, problem = parse_gpu(Output(query_csv, 0), "nvidia-smi")
    audit = Audit()
    driver_row()(Case("ws3090", expected, expected["driver"]), SimpleNamespace(gpu=facts, gpu_problem=problem), audit)
    return audit.row


def test_the_audit_expects_what_the_hosts_venv_build_needs():
    (target,) = spec_targets(load_spec(EXAMPLES_DIR / "seed1-3090.yml"))
    assert target.expected["driver"] == {"name": "driver ≥ what vLLM 0.25.0 (CUDA 13.0) needs", "minimum": 580,
                                         "nvidia_smi": "nvidia-smi"}
    containers_only = validate_spec(spec_data(instances=[instance("pod", 8000, container={"engine": "podman"})]))
    assert spec_targets(containers_only)[0].expected["driver"] is None


def test_the_row_from_the_recorded_h200_query_passes_and_an_older_driver_fails():
    (target,) = spec_targets(load_spec(EXAMPLES_DIR / "seed1-3090.yml"))
    recorded = (GPU_FIXTURES / "h200x1" / "query-gpu.csv").read_text()
    assert run_row(target.expected, recorded) == {
        "check": "driver ≥ what vLLM 0.25.0 (CUDA 13.0) needs", "expected": "≥ 580", "actual": "580.159.04"}
    with pytest.raises(Drift) as drift:
        run_row(target.expected, recorded.replace("580.159.04", "550.163.01"))
    assert (drift.value.check, drift.value.expected, drift.value.actual) == (
        "driver ≥ what vLLM 0.25.0 (CUDA 13.0) needs", "≥ 580", "550.163.01")


def test_the_driver_row_reads_the_gpu_query_even_where_no_gpu_is_listed():
    spec = validate_spec(spec_data(hosts=[host(gpus={})], instances=[instance("chat", 8000, gpus=[UUID0])]))
    commands = host_commands(spec_targets(spec)[0].expected)
    assert commands["gpu"].startswith("nvidia-smi --query-gpu=index,uuid,name,")


# --------------------------------------------------------------------------- the audit's rows of role nvidia_driver

DRIVER_RECORDINGS = Path(__file__).resolve().parent.parent / "fixtures" / "nvidia-driver"
KERNEL = "6.1.0-57-amd64"  # the recordings' headers kernel


def managed_target(**driver):
    spec = validate_spec(spec_data(hosts=[host(driver={"source": "distribution", "branch": "535",
                                                       "modules": "proprietary", **driver})]))
    return spec_targets(spec)[0].expected


def driver_facts(expected: dict, dpkg: str, modules: str, loaded: str | None = None, container: str | None = "systemd-nspawn"):
    """The facts the audit parses from the commands it runs, here from the recordings of a lab host."""
    out = {"driver_release": Output("bookworm\n", 0), "driver_packages": Output(dpkg, 0),
           "driver_modules": Output(modules, 0),
           "driver_loaded": Output(loaded or "cat: /sys/module/nvidia/version: No such file or directory\n", 0 if loaded else 1)}
    return SimpleNamespace(container=container, **nvidia_driver.read(expected, out))


def run_driver_rows(expected: dict, facts) -> dict[str, tuple[str, str, str]]:
    """Each row of role nvidia_driver as the audit reports it: check -> (status, expected, actual)."""
    rows = {}
    for check in (nvidia_driver.driver_packages, nvidia_driver.driver_module_built, nvidia_driver.driver_loaded):
        audit, status = Audit(), "passed"
        try:
            check(Case("ws3090", expected, expected["driver_install"]), facts, audit)
        except Drift:
            status = "failed"
        except NotApplicable:
            status = "n/a"
        found = audit.row
        rows[found["check"]] = (status, found["expected"], found["actual"])
    return rows


def test_the_audit_expects_the_roles_set_for_each_release_and_nothing_where_the_driver_is_not_managed():
    install = managed_target()["driver_install"]
    assert install["sets"]["bookworm"] == {"packages": ["nvidia-kernel-dkms", "nvidia-smi", "libcuda1", "libnvidia-cfg1"],
                                           "companions": ["nvidia-persistenced"], "module": "nvidia-current"}
    assert install["sets"]["noble"]["packages"] == ["nvidia-headless-535-server", "nvidia-utils-535-server"]
    assert install["sets"]["trixie"] == "trixie distribution has no driver branch 535 (branches: 550)"
    assert (install["branch"], install["hold"]) == ("535", True)
    commands = host_commands(managed_target())
    assert "nvidia-current" in commands["driver_modules"] and "dpkg-query --show" in commands["driver_packages"]
    (plain,) = spec_targets(validate_spec(spec_data()))
    assert plain.expected["driver_install"] is None and "driver_packages" not in host_commands(plain.expected)


def test_the_rows_pass_on_the_recorded_535_host_and_name_each_drift():
    expected = managed_target()
    dpkg = (DRIVER_RECORDINGS / "bookworm-535" / "dpkg-query.txt").read_text()
    version = (DRIVER_RECORDINGS / "bookworm-535" / "modinfo-name.txt").read_text().split()[1]
    modules = f"{KERNEL} nvidia-current {version}\n{KERNEL} nvidia-tesla-470 \n"
    packages = "nvidia-kernel-dkms, nvidia-smi, libcuda1, libnvidia-cfg1 at 535.*, held"
    built = "535.309.01 for every kernel with headers"
    assert run_driver_rows(expected, driver_facts(expected, dpkg, modules)) == {
        "driver packages: distribution 535": ("passed", packages, packages),
        "driver module nvidia-current": ("passed", built, built),
        "driver loaded": ("n/a", "535.309.01", "n/a: a container (systemd-nspawn) loads no kernel modules")}
    # a hold released by hand; a module not built for a second kernel's headers; a VM that loaded the old module
    drifted = dpkg.replace("nvidia-smi\t535.309.01-0+deb12u1\thold", "nvidia-smi\t535.309.01-0+deb12u1\tinstall")
    rows = run_driver_rows(expected, driver_facts(expected, drifted, modules + "6.1.0-58-amd64 nvidia-current \n",
                                                  loaded="470.256.02", container=None))
    assert rows == {
        "driver packages: distribution 535": ("failed", packages, "nvidia-smi not held"),
        "driver module nvidia-current": ("failed", built, f"{KERNEL}: 535.309.01; 6.1.0-58-amd64: (not built)"),
        "driver loaded": ("failed", "535.309.01", "470.256.02")}


def test_the_rows_name_the_470_host_against_a_535_pin():
    expected = managed_target(version="535.309.01", hold=False)
    dpkg = (DRIVER_RECORDINGS / "bookworm-470" / "dpkg-query.txt").read_text()
    rows = run_driver_rows(expected, driver_facts(expected, dpkg, f"{KERNEL} nvidia-current \n"))
    assert rows["driver packages: distribution 535"] == (
        "failed", "nvidia-kernel-dkms, nvidia-smi, libcuda1, libnvidia-cfg1 at 535.309.01, not held",
        "nvidia-kernel-dkms not installed; nvidia-smi not installed; libcuda1 not installed; libnvidia-cfg1 not installed")
    assert rows["driver module nvidia-current"] == (
        "failed", "535.* for every kernel with headers", f"{KERNEL}: (not built)")


# --------------------------------------------------------------------------- installing a CUDA build other than the default


def test_a_cuda_12_9_build_installs_as_pip_names_it_in_a_venv_of_its_own(tmp_path):
    from tests.doubles.vllm_wheel import build_standin_wheel

    build_standin_wheel("0.25.0+cu129", tmp_path)  # the TEST DOUBLE wheel, named as vLLM publishes the build
    spec = validate_spec(spec_data(hosts=[host(vllm={"version": "0.25.0", "cuda": "12.9", "wheelhouse": str(tmp_path)})]))
    variables = host_vars(spec.hosts[0], [])
    assert variables["vllm_install_version"] == "0.25.0+cu129"
    assert spec.hosts[0].vllm.venv == "/opt/vllm/venvs/0.25.0+cu129"
    default = validate_spec(spec_data())
    assert (host_vars(default.hosts[0], [])["vllm_install_version"], default.hosts[0].vllm.venv) == (
        "0.25.0", "/opt/vllm/venvs/0.25.0")


def test_a_wheelhouse_without_the_builds_wheel_is_refused_with_where_to_get_it(tmp_path):
    with pytest.raises(SpecError) as refused:
        validate_spec(spec_data(hosts=[host(vllm={"version": "0.25.0", "cuda": "12.9", "wheelhouse": str(tmp_path)})]))
    assert str(refused.value) == (
        f"hosts[0].vllm.wheelhouse: {tmp_path} holds no vllm-0.25.0+cu129 wheel — download vLLM 0.25.0 (CUDA 12.9)'s "
        "wheels into it: `pip download vllm==0.25.0+cu129 --extra-index-url https://wheels.vllm.ai/0.25.0/cu129 "
        f"--extra-index-url https://download.pytorch.org/whl/cu129 --only-binary=:all: --dest {tmp_path}`")
