"""The one gate (provisioner/validation/gate.py): every command that reads a spec refuses what `plan` refuses (an invalid
spec, an instance that would not fit its GPU, a driver too old) before it writes a file or touches a host, with
the same exit code with and without --json, control characters shown escaped, and no traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from provisioner.cli.main import app
from tests.unit.conftest import host, instance, spec_data, write_spec

PROVISION = Path(sys.executable).with_name("provision")  # the installed entry point
FITS = {"max-model-len": 4096}
INJECTED = "ws4070\nINJECTED LINE"


def invoke(*args):
    return CliRunner().invoke(app, [str(arg) for arg in args], env={"NO_COLOR": "1", "PROVISION_SPEC": ""})


def spec_file(tmp_path: Path, *, on: str = "ws4070", driver: dict | None = None, options: dict | None = None) -> Path:
    """One host no ssh reaches (port 1 of loopback: refused at once), one instance, monitoring."""
    data = spec_data(hosts=[host(address="127.0.0.1", ssh={"port": 1}, **({"driver": driver} if driver else {}))],
                     instances=[instance("chat", 8000, 0.3, on=on, bind="0.0.0.0",
                                         options=FITS if options is None else options)])
    data["monitoring"] = {}
    (tmp_path / "spec").mkdir(exist_ok=True)
    return write_spec(tmp_path / "spec" / "spec.yml", data)


def invalid(tmp_path: Path) -> Path:
    return spec_file(tmp_path, on=INJECTED)


def driver_too_old(tmp_path: Path) -> Path:
    return spec_file(tmp_path, driver={"source": "distribution", "branch": "535"})


def does_not_fit(tmp_path: Path) -> Path:
    return spec_file(tmp_path, options={})  # vLLM's default length: its KV cache holds less than one sequence


# each command that reads a spec, what it would write under OUT, and its exit code for a spec it refuses
COMMANDS = {
    "plan": (["plan"], 1),
    "inventory": (["inventory", "-o", "OUT/inventory"], 1),
    "apply": (["apply"], 1),
    "audit spec": (["audit", "spec", "--junit", "OUT/junit.xml"], 2),  # 1 reads as drift found
    "monitoring export": (["monitoring", "export", "--out", "OUT/monitoring"], 1),
    "tune": (["tune", "chat", "--slo", "ttft_p99<=200ms", "--results", "OUT/results"], 1),
    "bench run": (["bench", "run", "chat", "--results", "OUT/results"], 1),
}


def run(command: str, spec: Path, *extra: str):
    args, code = COMMANDS[command]
    out = spec.parent.parent / "out"
    return invoke(*[arg.replace("OUT", str(out)) for arg in args], "--spec", spec, *extra), code, out


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_refuses_an_invalid_spec_naming_the_field_escaped(tmp_path, command):
    result, code, out = run(command, invalid(tmp_path))
    assert result.exit_code == code, result.output
    assert "instances[0].host: unknown host 'ws4070\\nINJECTED LINE' — hosts in this spec: ws4070" in result.output
    assert "\nINJECTED LINE" not in result.output  # no line of its own
    assert "Traceback" not in result.output and not out.exists()


@pytest.mark.parametrize("command", [command for command in COMMANDS if command not in ("plan", "apply")])
@pytest.mark.parametrize(("spec", "named"), [
    (driver_too_old, "driver: ws4070: driver 535 (driver.branch) is too old for vLLM 0.25.0"),
    (does_not_fit, "memory: ws4070 GPU 0: chat: KV cache"),
])
def test_every_command_refuses_what_plan_refuses_touching_nothing(tmp_path, command, spec, named):
    path = spec(tmp_path)
    planned, _, _ = run("plan", path)
    assert planned.exit_code == 1 and named in planned.output  # what plan refuses (apply always refused it)
    result, code, out = run(command, path)
    assert result.exit_code == code, result.output
    assert named in result.output
    assert "Traceback" not in result.output and not out.exists()


@pytest.mark.parametrize(("command", "json_option"), [
    ("plan", ["--json"]), ("apply", ["--json"]), ("audit spec", ["--json", "-"])])
@pytest.mark.parametrize(("spec", "field"), [
    (invalid, "instances[0].host"), (driver_too_old, "hosts[0].driver.branch"),
    (does_not_fit, "hosts[0].gpus.devices[0]")])
def test_json_on_a_refusal_is_a_json_error_object_with_the_exit_code_of_text(tmp_path, command, json_option, spec,
                                                                             field):
    path = spec(tmp_path)
    as_text, code, _ = run(command, path)
    as_json, _, out = run(command, path, *json_option)
    assert as_json.exit_code == as_text.exit_code == code
    error = json.loads(as_json.output)  # nothing else printed
    problem = next(problem for problem in error["problems"] if problem["field"] == field)
    assert problem["message"] and problem["fix"]
    assert not out.exists()


def test_the_json_report_file_of_audit_holds_the_error(tmp_path):
    report = tmp_path / "report.json"
    result = invoke("audit", "spec", "--json", report, "--spec", driver_too_old(tmp_path))
    assert result.exit_code == 2
    assert json.loads(report.read_text())["problems"][0]["field"] == "hosts[0].driver.branch"
    assert "driver: ws4070: driver 535" in result.output  # the lines too: stdout is not the report's


def test_an_unknown_host_argument_with_json_is_a_json_error_exit_2(tmp_path):
    result = invoke("plan", "ws4007", "--json", "--spec", driver_too_old(tmp_path))
    assert result.exit_code == 2
    assert json.loads(result.output)["problems"] == [
        {"field": "HOST|GROUP", "message": f"no host or group 'ws4007' in {tmp_path / 'spec' / 'spec.yml'}",
         "fix": "hosts: ws4070 (or all)"}]


def test_a_user_runs_into_the_gate_in_a_pipe(tmp_path):
    """The installed entry point: stdout holds the JSON error alone, stderr nothing; no traceback."""
    result = subprocess.run([str(PROVISION), "apply", "--json", "--spec", str(invalid(tmp_path))],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and result.stderr == ""
    error = json.loads(result.stdout)
    assert error["error"].endswith("spec.yml: 2 problems")
    assert [problem["field"] for problem in error["problems"]] == ["instances[0].host", "instances[0].host"]
    result = subprocess.run([str(PROVISION), "inventory", "-o", str(tmp_path / "inventory"), "--spec",
                             str(driver_too_old(tmp_path))], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and result.stdout == "" and not (tmp_path / "inventory").exists()
    assert result.stderr.splitlines()[-1] == ("nothing was written and no host was touched: fix the driver or the "
                                              "spec (`provision plan` shows what each host needs)")
