"""The hostile corpus (issue 34, point 5) through every command that reads a spec.

Each case of tests/unit/hostile_corpus.py, in a fresh folder (the working directory, $HOME, $XDG_STATE_HOME and
the temporary folder all in it), through each command: refused with the command's refusal code, the field named,
no traceback, within TIME_BOUND seconds, no file written or changed, the case's secret in no output and no file,
and no ssh run (a stub `ssh` and `ssh-keyscan` first on PATH record any call and fail). In-process (typer's
CliRunner: milliseconds a command); a few cases also through the real `provision` script, in a subprocess.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from provisioner.cli.main import app
from tests.unit.hostile_corpus import (ARGUMENTS, COMMANDS, CORPUS, REFUSAL_EXIT, SECTIONS, SPEC_NAME,
                                       Case, base_spec)

TIME_BOUND = 20  # seconds a command may take to refuse a case
# what a terminal would act on: C0 and C1 control characters (ANSI escapes start with ESC, U+001B) but newline
RAW_CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")
runner = CliRunner()


class Hung(Exception):
    """A command ran past TIME_BOUND."""


@contextmanager
def time_bound(seconds: int):
    """Interrupts the main thread (a blocking open or read too) with `Hung` after `seconds`."""
    def expire(signum, frame):
        raise Hung(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def secret_of(case: Case) -> str:
    """A marker unique to the case, found nowhere else."""
    return "corpus" + hashlib.sha256(case.id.encode()).hexdigest()[:20]


def write_case(case: Case, folder: Path) -> Path:
    """The case's spec (and the files it names) in `folder`."""
    secret = secret_of(case)
    data = base_spec(folder, secret)
    if case.text is not None:
        text = case.text(folder, secret)
    else:
        case.change(data, folder, secret)
        text = yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
    spec = folder / SPEC_NAME
    spec.write_text(text, encoding="utf-8", errors="surrogateescape")  # a lone surrogate: a byte that is not UTF-8
    return spec


def ssh_stub(folder: Path) -> Path:
    """A folder with `ssh` and `ssh-keyscan` that append their arguments to folder/calls and exit 255."""
    folder.mkdir()
    for name in ("ssh", "ssh-keyscan"):
        stub = folder / name
        stub.write_text(f'#!/bin/sh\necho "{name} $*" >> "{folder}/calls"\nexit 255\n')
        stub.chmod(0o755)
    return folder


def tree(folder: Path) -> dict[str, str]:
    """Every entry under `folder`: a file's sha256, else what it is (folders, FIFOs, links)."""
    found = {}
    for path in sorted(folder.rglob("*")):
        name = str(path.relative_to(folder))
        if path.is_symlink():
            found[name] = f"link to {os.readlink(path)}"
        elif path.is_file():
            found[name] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            found[name] = "folder" if path.is_dir() else "other"
    return found


def written_holding(folder: Path, before: dict[str, str], secret: str) -> list[str]:
    """Files new or changed since `before` that hold `secret`."""
    after = tree(folder)
    return [name for name, digest in after.items() if before.get(name) != digest
            and (folder / name).is_file() and not (folder / name).is_symlink()
            and secret.encode() in (folder / name).read_bytes()]


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """(the case's folder, the environment to run in, the stub's calls file)."""
    folder = tmp_path / "case"
    (folder / "tmp").mkdir(parents=True)
    stub = ssh_stub(tmp_path / "stub")
    monkeypatch.chdir(folder)
    monkeypatch.setattr(tempfile, "tempdir", str(folder / "tmp"))
    env = {"HOME": str(folder), "XDG_STATE_HOME": str(folder / "state"), "TMPDIR": str(folder / "tmp"),
           "PATH": f"{stub}:{os.environ['PATH']}", "PROVISION_SPEC": None, "COLUMNS": "200", "NO_COLOR": "1"}
    return folder, env, stub / "calls"


def marks(case: Case, command: str) -> list:
    reason = case.pending.get(command) or case.pending.get("*")
    return [pytest.mark.xfail(strict=True, reason=reason)] if reason else []


def json_problems(stdout: str) -> list[dict]:
    """The problems of a --json refusal, {"error": …, "problems": [{"field", "message", "fix"}, …]}, or of a plan
    the preflight refuses (the plan, and its problems the same way under "problems")."""
    try:
        refusal = json.loads(stdout)
    except ValueError:
        return []
    problems = refusal.get("problems") if isinstance(refusal, dict) else None
    return [problem for problem in problems or [] if isinstance(problem, dict)]


def json_names(problems: list[dict], field: str) -> bool:
    """A problem is about `field`, or names it: the other owner of a port two listeners share, the option of an
    instance that does not fit its GPU (the problem's field is the GPU)."""
    return any(field in " ".join((problem.get("field", ""), problem.get("message", ""), problem.get("fix", "")))
               for problem in problems)


@pytest.mark.parametrize("case, command", [
    pytest.param(case, command, id=f"{case.id}:{command}", marks=marks(case, command))
    for case in CORPUS for command in COMMANDS])
def test_every_command_refuses_the_case_cleanly(isolated, case, command):
    folder, env, ssh_calls = isolated
    spec = write_case(case, folder)
    before = tree(folder)
    started = time.monotonic()
    with time_bound(TIME_BOUND):
        result = runner.invoke(app, [*COMMANDS[command], "--spec", str(spec)], env=env)
    elapsed = time.monotonic() - started
    output = result.output

    assert not isinstance(result.exception, Hung), f"{command} hung: {output[-2000:]}"
    assert elapsed < TIME_BOUND
    assert isinstance(result.exception, SystemExit), f"{command} raised {result.exception!r}"
    assert "Traceback" not in output
    assert result.exit_code == REFUSAL_EXIT[command], f"{command} exited {result.exit_code}: {output[-2000:]}"
    if command == "plan --json":
        assert json_names(json_problems(result.stdout), case.field), result.stdout[-2000:]
    else:
        assert case.field in output, f"{case.field!r} not named: {output[-2000:]}"
    assert tree(folder) == before, f"{command} wrote or changed files"
    assert not ssh_calls.exists(), f"{command} ran ssh: {ssh_calls.read_text()}"
    assert secret_of(case) not in output
    assert written_holding(folder, before, secret_of(case)) == []
    assert not RAW_CONTROL.search(output), f"raw control character in: {output[-2000:]!r}"


# --------------------------------------------------------------------------- the corpus itself


def test_the_base_spec_is_accepted_so_each_refusal_is_its_cases_doing(isolated):
    folder, env, ssh_calls = isolated
    spec = folder / SPEC_NAME
    spec.write_text(yaml.safe_dump(base_spec(folder, "corpusbase"), sort_keys=False))
    for args in (["plan"], ["inventory", "-o", "inventory-out"], ["monitoring", "export", "--out", "monitoring-out"]):
        result = runner.invoke(app, [*args, "--spec", str(spec)], env=env)
        assert result.exit_code == 0, (args, result.output[-2000:])
    assert "corpusbase" not in runner.invoke(app, ["plan", "--spec", str(spec)], env=env).output  # redacted


def test_the_corpus_covers_every_section_with_200_cases_or_more():
    per_section = {section: sum(case.section == section for case in CORPUS) for section in SECTIONS}
    assert sum(per_section.values()) == len(CORPUS) >= 200
    assert min(per_section.values()) >= 15, per_section
    assert len({case.id for case in CORPUS}) == len(CORPUS), "two cases share a name"
    assert all((case.change is None) != (case.text is None) for case in CORPUS)


@pytest.mark.parametrize("section", SECTIONS)
def test_the_real_script_refuses_a_case_of_each_section(tmp_path, section):
    """Through `provision` itself (main.run: no traceback ever, 70 for a bug), in a subprocess with a timeout."""
    case = next(case for case in CORPUS if case.section == section and not case.pending)
    folder = tmp_path / "case"
    folder.mkdir()
    spec = write_case(case, folder)
    before = tree(folder)
    stub = ssh_stub(tmp_path / "stub")
    env = {**os.environ, "HOME": str(folder), "XDG_STATE_HOME": str(folder / "state"),
           "PATH": f"{stub}:{os.environ['PATH']}", "NO_COLOR": "1"}
    env.pop("PROVISION_SPEC", None)
    script = Path(sys.executable).with_name("provision")
    run = subprocess.run([str(script), "apply", "--spec", str(spec)], cwd=folder, env=env, capture_output=True,
                         text=True, timeout=TIME_BOUND)
    assert run.returncode == REFUSAL_EXIT["apply"], run.stderr[-2000:]
    assert case.field in run.stderr and "Traceback" not in run.stdout + run.stderr
    assert tree(folder) == before and not (stub / "calls").exists()
    assert secret_of(case) not in run.stdout + run.stderr


@pytest.mark.parametrize("case", ARGUMENTS, ids=[case.id for case in ARGUMENTS])
def test_every_hostile_argument_is_refused_cleanly_naming_it(isolated, case):
    """A valid spec, a hostile command-line argument: usage error or refusal (never 0, never 70), the option
    named, control characters escaped, within TIME_BOUND, no file written, no ssh run."""
    folder, env, ssh_calls = isolated
    spec = folder / SPEC_NAME
    spec.write_text(yaml.safe_dump(base_spec(folder, "corpusarguments"), sort_keys=False))
    before = tree(folder)
    with time_bound(TIME_BOUND):
        result = runner.invoke(app, [*case.args, "--spec", str(spec)], env=env)
    output = result.output

    assert not isinstance(result.exception, Hung), output[-2000:]
    assert isinstance(result.exception, SystemExit), f"raised {result.exception!r}: {output[-2000:]}"
    assert result.exit_code in (1, 2), f"exited {result.exit_code}: {output[-2000:]}"
    assert "Traceback" not in output
    assert case.option in output, f"{case.option!r} not named: {output[-2000:]}"
    assert not RAW_CONTROL.search(output), f"raw control character in: {output[-2000:]!r}"
    assert "\nINJECTED" not in output
    assert tree(folder) == before and not ssh_calls.exists()
    assert "corpusarguments" not in output
