"""The TEST DOUBLE vLLM wheels (tests/doubles/vllm_wheel.py) installed as the role vllm_install installs
them (a venv, pip from the wheelhouse alone): the good one serves; the broken one (fails_at_start: a
failed upgrade) installs, says its version and passes the config check, but `vllm serve` dies as vLLM
dies of a fatal start-up error and never listens."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from provisioner.audit import processes
from tests.doubles import vllm_wheel
from tests.doubles.vllm_wheel import build_standin_wheel, shared_folder
from tests.unit.standin import MODEL, ROOT, free_port, listening, standin, stop

VERSION = "0.33.0"
FATAL = "RuntimeError: CUDA driver version is insufficient for CUDA runtime version"
CHECK_ARGS = ROOT / "roles" / "vllm_service" / "files" / "vllm-check-args.py"


def installed(wheel: Path, venv: Path) -> Path:
    """`vllm` from `wheel`, in a new venv: its bin folder. (This pip installs into it: a venv's own pip
    takes 15 s to set up here.)"""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                    "--disable-pip-version-check", "--no-index", "--find-links", str(wheel.parent),
                    f"vllm=={VERSION}"], check=True)
    return venv / "bin"


def test_the_broken_wheel_installs_and_checks_but_never_starts(tmp_path):
    wheel = build_standin_wheel(VERSION, tmp_path / f"standin-wheelhouse-{VERSION}-broken", fails_at_start=FATAL)
    bin_dir = installed(wheel, tmp_path / "venv")
    version = subprocess.run([bin_dir / "vllm", "--version"], capture_output=True, text=True, check=True)
    assert version.stdout.strip() == VERSION
    config = tmp_path / "chat.yaml"
    config.write_text(f'model: "{MODEL}"\nmax-model-len: 4096\n')
    check = subprocess.run([bin_dir / "python", CHECK_ARGS, "serve", "--config", config], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    wrong = subprocess.run([bin_dir / "vllm", "serve", MODEL, "--no-such-flag"], capture_output=True, text=True)
    assert wrong.returncode == 2 and "unrecognized arguments: --no-such-flag" in wrong.stderr  # the parser first

    port = free_port()
    server = subprocess.Popen([bin_dir / "vllm", "serve", MODEL, "--host", "127.0.0.1", "--port", str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        opened, deadline = False, time.monotonic() + 30
        while server.poll() is None and time.monotonic() < deadline:  # watched from its start to its end
            opened = opened or listening(port)
        stdout, stderr = server.communicate(timeout=1)
    finally:
        if server.poll() is None:
            stop(server)
    assert server.returncode == 1, stderr
    assert stderr.splitlines()[0] == "Traceback (most recent call last):"
    assert stderr.splitlines()[-1] == FATAL
    assert not opened and not listening(port) and "serving" not in stdout


def test_the_good_wheel_of_that_version_still_serves(tmp_path):
    good = build_standin_wheel(VERSION, tmp_path / f"standin-wheelhouse-{VERSION}")
    broken = build_standin_wheel(VERSION, tmp_path / f"standin-wheelhouse-{VERSION}-broken", fails_at_start=FATAL)
    assert good.name == broken.name and good.read_bytes() != broken.read_bytes()
    bin_dir = installed(good, tmp_path / "venv")
    port = free_port()
    server = standin(port, tmp_path / "standin.log", vllm=bin_dir / "vllm")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as answer:
            assert answer.status == 200
        # its maps name vllm/_C.abi3.so as a real vLLM's do: the audit reads the version it runs from them
        site = next((tmp_path / "venv" / "lib").glob("python3*/site-packages"))
        imported = processes.imported_vllm(server.pid)
        assert imported == {"package": str(site / "vllm"), "objects": ["_C.abi3.so"], "deleted": False,
                            "version": VERSION}
    finally:
        stop(server)


def test_a_broken_wheel_has_a_wheelhouse_of_its_own(tmp_path):
    with pytest.raises(ValueError, match="-broken"):
        build_standin_wheel(VERSION, tmp_path / f"standin-wheelhouse-{VERSION}", fails_at_start=FATAL)
    with pytest.raises(ValueError, match="-broken"):
        build_standin_wheel(VERSION, tmp_path / f"standin-wheelhouse-{VERSION}-broken")
    with pytest.raises(ValueError, match="one line"):
        build_standin_wheel(VERSION, tmp_path / "w-broken", fails_at_start="RuntimeError: a\nb")
    assert not any(tmp_path.iterdir())


def test_the_shared_wheelhouse_is_keyed_on_the_stand_ins_source(tmp_path, monkeypatch):
    """Labs of two checkouts side by side: a stand-in whose source differs builds into another folder."""
    package = tmp_path / "vllm"
    shutil.copytree(vllm_wheel.PACKAGE, package)
    monkeypatch.setattr(vllm_wheel, "PACKAGE", package)
    first = shared_folder(VERSION)
    assert first == shared_folder(VERSION) and first.startswith(f"standin-wheelhouse-{VERSION}-")
    assert shared_folder(VERSION, broken=True) == first + "-broken"
    server = package / "entrypoints" / "cli" / "standin_openai.py"
    server.write_text(server.read_text() + "# another checkout\n")
    assert shared_folder(VERSION) != first
