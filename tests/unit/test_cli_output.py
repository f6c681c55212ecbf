"""What the CLI prints for people and for programs: --version, shell completion, and tables that a pipe
gets whole (no 80-column cut or fold, whatever the terminal around it)."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import time
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from rich.markup import escape
from typer.testing import CliRunner

from provisioner.audit.report import host_table
from provisioner.audit.runner import CheckResult, HostReport
from provisioner.base.paths import PACKAGE_DIR
from provisioner.cli.console import make_console
from provisioner.cli.main import app
from tests.unit.conftest import host, instance, spec_data, write_spec

PROVISION = Path(sys.executable).with_name("provision")  # the installed entry point
PYPROJECT = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text(encoding="utf-8"))
H200X2 = Path(__file__).resolve().parents[1] / "fixtures" / "gpu" / "h200x2" / "nvml.json"
LONG = "x" * 60 + "-" + "y" * 60 + "-" + "z" * 60  # 182 characters: no terminal row holds it


def piped(*args: str, **env: str) -> subprocess.CompletedProcess:
    """The CLI in a pipe, as `provision ... | less` runs it: no COLUMNS, stdout and stderr not terminals."""
    environ = {key: value for key, value in os.environ.items() if key not in ("COLUMNS", "LINES")}
    return subprocess.run([str(PROVISION), *args], capture_output=True, text=True, timeout=120,
                          env={**environ, **env}, stdin=subprocess.DEVNULL)


def pin(name: str) -> str:
    requirements = PYPROJECT["project"]["dependencies"] + sum(PYPROJECT["project"]["optional-dependencies"].values(), [])
    (version,) = {re.split(r"==", requirement)[1] for requirement in requirements
                  if re.split(r"[=<>;\s\[]", requirement)[0] == name}
    return version


def test_version_comes_from_the_installed_distribution_with_the_pins():
    result = piped("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout == (f"vllm-provision {PYPROJECT['project']['version']} "
                             f"(ansible-core {metadata.version('ansible-core')}, vLLM {pin('vllm')})\n")


@pytest.mark.parametrize("typed, offered", [
    ("provision au", ["audit"]),
    ("provision a", ["apply", "audit"]),
    ("provision audit sp", ["spec"]),
    ("provision audit spec --ju", ["--junit"]),
])
def test_bash_completes_command_names_and_options(typed, offered):
    words = typed.split(" ")
    result = piped(_PROVISION_COMPLETE="complete_bash", COMP_WORDS=typed, COMP_CWORD=str(len(words) - 1))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == offered


def test_bash_completes_the_names_of_the_spec_and_the_profiles(tmp_path):
    """<Tab> offers the spec's hosts, groups and instances (the spec of --spec, or $PROVISION_SPEC), the audit's
    profiles and bench's loads; a spec that cannot be read offers nothing, and says nothing."""
    spec = write_spec(tmp_path / "fleet.yml", spec_data(
        hosts=[host("ws4070", groups=["rack_a"]), host("ws3090", "192.0.2.10", groups=["rack_a", "big"])],
        instances=[instance("chat", 8000), instance("code", 8000, on="ws3090")]))

    def offered(typed: str, **env: str) -> list[str]:
        result = piped(_PROVISION_COMPLETE="complete_bash", COMP_WORDS=typed, COMP_CWORD=str(len(typed.split(" ")) - 1),
                       **env)
        assert result.returncode == 0 and result.stderr == "", result.stderr
        return result.stdout.split()

    assert offered(f"provision apply --spec {spec} ") == ["ws4070", "ws3090", "rack_a", "big", "all"]
    assert offered(f"provision audit spec --spec {spec} ws") == ["ws4070", "ws3090"]
    assert offered("provision plan r", PROVISION_SPEC=str(spec)) == ["rack_a"]
    assert offered(f"provision bench run --spec {spec} c") == ["chat", "code"]
    assert offered(f"provision tune --spec {spec} co") == ["code"]
    assert offered("provision audit host root@h --profile r") == ["recommended"]
    assert "long-prompt" in offered(f"provision bench run chat --spec {spec} --load l")
    (tmp_path / "broken.yml").write_text("hosts: [\n")
    assert offered(f"provision apply --spec {tmp_path / 'broken.yml'} ") == []
    # hostile specs complete nothing, at once: a FIFO (reading it would block the shell), aliases that expand
    # without bound, a duplicate key
    os.mkfifo(tmp_path / "fifo.yml")
    laughs = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + level)}: &{chr(98 + level)} [{', '.join([f'*{chr(97 + level)}'] * 10)}]\n" for level in range(8))
    (tmp_path / "laughs.yml").write_text(laughs + "hosts: [{name: laughing}]\n")
    (tmp_path / "twice.yml").write_text("hosts: [{name: a}]\nhosts: [{name: b}]\n")
    for hostile in ("fifo.yml", "laughs.yml", "twice.yml"):
        started = time.monotonic()
        assert offered(f"provision apply --spec {tmp_path / hostile} ") == [], hostile
        assert time.monotonic() - started < 10, hostile


def test_show_completion_prints_the_script_for_the_shell():
    # the shell named, not detected from the processes above (typer's own switch): under a `timeout` or a
    # service, not a shell, detection finds none and typer says "Shell  not supported"
    result = piped("--show-completion", "bash", _TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION="1")
    assert result.returncode == 0, result.stderr
    assert "_PROVISION_COMPLETE=complete_bash" in result.stdout and "complete -o default -F" in result.stdout


def test_facts_table_in_a_pipe_keeps_every_cell_whole():
    result = piped("facts", "--from-recording", str(H200X2))
    assert result.returncode == 0, result.stderr
    gpus = json.loads(piped("facts", "--json", "--from-recording", str(H200X2)).stdout)["gpus"]
    uuids_row = next(row for row in table_rows(result.stdout) if row.startswith("│ UUID"))
    assert all(gpu["uuid"] in uuids_row for gpu in gpus)  # both UUIDs whole, on the one row
    assert any("PCIe path PHB, NVLink" in row for row in table_rows(result.stdout))


def table_rows(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("│")]


def test_plan_tables_in_a_pipe_keep_every_cell_whole(tmp_path):
    spec = write_spec(tmp_path / "provision.yml", spec_data(
        hosts=[host(settings={"sysctls": {"net.core.long_one": LONG}})],
        instances=[instance("chat", 8000, share=0.9, env={"LONG_VALUE": LONG})]))
    result = piped("plan", "--spec", str(spec))
    assert result.returncode == 0, result.stderr
    rows = table_rows(result.stdout)  # (the files shown above the tables hold the value too: not counted)
    assert any("net.core.long_one" in row and LONG in row for row in rows)  # the sysctls table
    assert any("LONG_VALUE" in row and LONG in row for row in rows)  # the environment table


def test_plan_tables_through_the_test_runner_are_whole_too(tmp_path):
    spec = write_spec(tmp_path / "provision.yml", spec_data(hosts=[host(settings={"sysctls": {"net.core.long_one": LONG}})],
                                                            instances=[instance("chat", 8000, share=0.9)]))
    result = CliRunner().invoke(app, ["plan", "--spec", str(spec)])
    assert result.exit_code == 0, result.output
    assert any("net.core.long_one" in row and LONG in row for row in table_rows(result.output))


def test_an_audit_table_in_a_file_keeps_every_cell_whole():
    check = CheckResult(host="ws", check=f"sysctl file: {LONG}", expected=LONG, actual="y" * 150, status="failed", message="")
    report = HostReport(host="ws", address="192.0.2.20", checks=[check])
    out = io.StringIO()
    make_console(file=out).print(host_table(report))
    row = next(line for line in out.getvalue().splitlines() if "failed" in line and "│" in line)
    assert f"sysctl file: {LONG}" in row and LONG in row and "y" * 150 in row


def test_a_rule_in_a_pipe_stays_80_columns():
    out = io.StringIO()
    make_console(file=out).rule("ws4070")
    assert len(out.getvalue().rstrip("\n")) == 80


def test_every_console_of_the_cli_is_made_by_the_console_module():
    """One way to make a console: a Console(...) anywhere else in the CLI would cut tables in pipes again."""
    made_elsewhere = [f"{path.name}:{number}" for path in sorted((PACKAGE_DIR / "cli").glob("*.py"))
                      if path.name != "console.py"
                      for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
                      if re.search(r"\bConsole\(", line)]
    assert made_elsewhere == []


def test_an_interrupted_apply_says_where_it_stopped_and_names_each_hosts_changes_up_to_a_bound():
    from provisioner.apply.events import HostProgress
    from provisioner.apply.playbook import ApplyResult
    from provisioner.cli.apply_view import SHOWN_CHANGES, how_far, how_it_stopped

    many = HostProgress(done=40, changed=[f"role : task {index}" for index in range(SHOWN_CHANGES + 3)], last="role : x")
    said = how_far(many)
    assert said.startswith(f"40 tasks done, {SHOWN_CHANGES + 3} changed (role : task 0; ")
    assert f"role : task {SHOWN_CHANGES - 1}; and 3 more)" in said and said.endswith("last: `role : x`")
    cut = HostProgress(done=3, running="sysctl : Write")
    assert how_far(cut) == "3 tasks done, 0 changed; cut in the middle of `sysctl : Write`: its change may be half made"
    clean = ApplyResult(rc=130, interrupted=True, stopped_before="sysctl : Apply", progress={"gpu1": many})
    assert how_it_stopped(clean).startswith("stopped before `sysctl : Apply`, no task cut")
    hard = ApplyResult(rc=130, interrupted=True, stopped_before="", progress={"gpu1": many, "gpu2": cut})
    assert how_it_stopped(hard).startswith("stopped at once, in the middle of a task on gpu2;")


TABLES = [  # (columns, rows, title): what the plan prints, and what could break a hand-made layout
    (("kernel parameter", "value"), [("vm.swappiness", "1"), ("vm.max_map_count", "262144")], "sysctls"),
    (("variable", "value"), [], "environment of vllm-chat"),
    (("a", "b"), [("two\nlines", "z"), ("ü→", "日本語"), ("", LONG)], ""),
    (("x",), [("[bold]not markup[/]",)], "a [title] wider than the table itself"),
]


def rich_table(columns, rows, title) -> str:
    from rich.table import Table
    from rich.text import Text

    out = io.StringIO()
    table = Table(*columns, title=Text(title) if title else None)
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))
    make_console(file=out).print(table)
    return out.getvalue()


@pytest.mark.parametrize("columns, rows, title", TABLES)
def test_a_table_off_a_terminal_is_written_as_rich_writes_it(columns, rows, title):
    from provisioner.cli.console import print_table, table_text

    out = io.StringIO()
    print_table(make_console(file=out), columns, rows, title)
    assert out.getvalue() == table_text(columns, rows, title) == rich_table(columns, rows, title)


@pytest.mark.parametrize("title", ["gen000 (10.88.15.10)", "a (b)", "x", "日本 (10.0.0.1)", "[bold]gpu1[/] (::1)",
                                   "h" * 76, "h" * 77, "node-" * 20 + " (2001:db8:1234:5678:9abc:def0:1234:5678)"])
def test_a_rule_off_a_terminal_is_drawn_as_rich_draws_it(title):
    from provisioner.cli.console import print_rule

    ours, rich = io.StringIO(), io.StringIO()
    print_rule(make_console(file=ours), title)
    make_console(file=rich).rule(escape(title))
    assert ours.getvalue() == rich.getvalue()


def test_a_table_in_a_terminal_is_laid_out_by_rich_to_fit_it():
    from provisioner.cli.console import _Console, print_table

    out = io.StringIO()
    terminal = _Console(file=out, force_terminal=True, width=40, highlight=False, soft_wrap=True)
    print_table(terminal, ("variable", "value"), [("VLLM_LOGGING_LEVEL", LONG)], "environment")
    assert max(len(re.sub(r"\x1b\[[0-9;]*m", "", line)) for line in out.getvalue().splitlines()) <= 40


def test_apply_quiet_shows_the_changes_and_failures_the_run_log_keeps_every_task(capsys):
    from provisioner.apply.events import TaskResult
    from provisioner.cli.apply_view import Output, print_result

    results = [TaskResult("gpu1", "sysctl", "Write the settings", "ok"),
               TaskResult("gpu1", "nvidia_driver", "Say what the host has", "ok", notes=["would install 580"]),
               TaskResult("gpu1", "shm", "Mount /dev/shm", "changed", notes=["size 16G"]),
               TaskResult("gpu1", "nouveau", "Blacklist", "skipped"),
               TaskResult("gpu1", "vllm_service", "Start", "failed", message="not ready")]
    for quiet in (False, True):
        log = io.StringIO()
        out = Output(quiet=quiet)
        out.consoles.append(make_console(file=log))  # as keep_log does, on a run log
        for result in results:
            print_result(result, out)
        shown, kept = capsys.readouterr().out, log.getvalue()
        assert ("sysctl : Write the settings" in shown) is not quiet
        for text in ("changed gpu1", "shm : Mount /dev/shm", "size 16G", "failed gpu1", "not ready",
                     "nvidia_driver : Say what the host has", "would install 580"):
            assert text in shown
        ok_line = [line for line in kept.splitlines() if "sysctl : Write the settings" in line]
        assert len(ok_line) == 1 and "Blacklist" not in kept
        assert shown.splitlines() == [line for line in kept.splitlines() if not quiet or line not in ok_line]
