"""Installed as a user installs it, away from any checkout, against one real lab host.

Built once per module: the wheel and the sdist (`python -m build`), and the Ansible collection
(`ansible-galaxy collection build`). Then, each from an empty folder with no checkout on sys.path,
PYTHONPATH unset and no ansible.cfg of ours around:
- the wheel in a fresh venv: --version, init + plan, inventory, apply, audit, bench compare without
  the extra `plot`;
- the sdist in another fresh venv: --version, init + plan, audit;
- the wheel with pipx (PIPX_HOME and PIPX_BIN_DIR in a temporary folder): --version, init + plan;
- the collection tarball installed into an empty collections path, its site playbook run with plain
  `ansible-playbook` on the inventory the wheel's `provision inventory` wrote: after the wheel's apply it
  converges with nothing changed (the two ways are one).
Dependencies come once from the tested lock (constraints.txt) into a wheelhouse; every install is `--no-index` from it. Each step's
seconds show in one line ("install: ...") once the module is done.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
import zipfile
from dataclasses import dataclass
from importlib.metadata import version as installed_version
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

from provisioner.audit.runner import disconnect
from provisioner.fleet.remote import Connection
from tests.lab.specs import host_entry, install_standin, instance_entry, write_spec

REPO = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
VERSION = PROJECT["project"]["version"]
# what the tool runs besides its Python code: the collection and the examples, from the repository's top level
CONTENT = ("galaxy.yml", "README.md", "meta", "plugins", "roles", "playbooks", "templates", "inventory/examples")
RECORDED_BENCH = REPO / "tests" / "fixtures" / "vllm" / "h200-bench" / "results"
TIMINGS: dict[str, float] = {}  # step -> seconds, shown once the module is done


def spec_args(spec: Path) -> list[str]:
    """How every command here is given the spec: the one place to change if the CLI's form changes."""
    return ["--spec", str(spec)]


def timed(step: str, command: list, **kwargs) -> subprocess.CompletedProcess:
    started = time.monotonic()
    result = run(command, **kwargs)
    TIMINGS[step] = TIMINGS.get(step, 0.0) + time.monotonic() - started
    return result


def run(command: list, cwd: Path, env: dict[str, str], check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess:
    result = subprocess.run([str(part) for part in command], cwd=cwd, env=env, capture_output=True, text=True,
                            timeout=timeout, stdin=subprocess.DEVNULL)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, command))} exited {result.returncode} in {cwd}\n"
                             f"stdout: {result.stdout[-4000:]}\nstderr: {result.stderr[-4000:]}")
    return result


def outside_env(home: Path, **extra: str) -> dict[str, str]:
    """This machine's environment as a user's shell has it: no PYTHONPATH, no virtualenv, no ANSIBLE_*
    setting, nothing of the checkout on PATH; $HOME an empty folder of the test's."""
    dropped = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "PIPX_", "ANSIBLE_", "PYTEST_")
    env = {key: value for key, value in os.environ.items() if not key.startswith(dropped)}
    env["PATH"] = os.pathsep.join(part for part in env.get("PATH", "").split(os.pathsep)
                                  if part and not Path(part).resolve().is_relative_to(REPO))
    home.mkdir(parents=True, exist_ok=True)
    return {**env, "HOME": str(home), "COLUMNS": "200", **extra}


def empty_folder(parent: Path, name: str) -> Path:
    folder = parent / name
    folder.mkdir(parents=True)
    return folder


def from_wheelhouse(wheelhouse: Path, home: Path) -> dict[str, str]:
    """pip (and pipx, and build's pip) install from the wheelhouse alone (no byte-compiling: Python does it
    on first use)."""
    return outside_env(home, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(wheelhouse), PIP_DISABLE_PIP_VERSION_CHECK="1",
                       PIP_NO_COMPILE="1")


@dataclass
class Artefacts:
    wheel: Path
    sdist: Path
    collection: Path
    wheelhouse: Path
    scratch: Path

    def install_env(self, home: Path) -> dict[str, str]:
        return from_wheelhouse(self.wheelhouse, home)


@dataclass
class Installed:
    """One installation: its `provision` and Python, the empty folder it runs in, its $HOME."""

    name: str
    provision: Path
    python: Path
    folder: Path
    home: Path

    @property
    def env(self) -> dict[str, str]:
        return outside_env(self.home)

    def __call__(self, *args, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess:
        return run([self.provision, *args], cwd=self.folder, env=self.env, check=check, timeout=timeout)


@pytest.fixture(scope="module")
def artefacts(tmp_path_factory) -> Artefacts:
    scratch = tmp_path_factory.mktemp("install")
    wheelhouse, dist, collections = scratch / "wheelhouse", scratch / "dist", scratch / "collection"
    home = scratch / "build-home"
    # the dependencies' wheels (and the build backend's, and pip for pipx's shared venv) at the versions of the
    # tested lock (constraints.txt), downloaded once
    pins = [*PROJECT["project"]["dependencies"], *PROJECT["build-system"]["requires"], f"pip=={installed_version('pip')}"]
    timed("wheelhouse (pip download)", [sys.executable, "-m", "pip", "download", "-q", "-d", wheelhouse,
                                        "--constraint", REPO / "constraints.txt", *pins], cwd=scratch, env=outside_env(home))
    timed("build wheel + sdist", [sys.executable, "-m", "build", "--outdir", dist, REPO],
          cwd=scratch, env=from_wheelhouse(wheelhouse, home))
    timed("build collection", [Path(sys.executable).with_name("ansible-galaxy"), "collection", "build",
                               "--output-path", collections, REPO], cwd=scratch, env=outside_env(home))
    (wheel,), (sdist,) = dist.glob("vllm_provision-*.whl"), dist.glob("vllm_provision-*.tar.gz")
    (collection,) = collections.glob("vllm_provision-gpu_host-*.tar.gz")
    return Artefacts(wheel, sdist, collection, wheelhouse, scratch)


def venv_install(artefacts: Artefacts, name: str, package: Path) -> Installed:
    """A fresh venv in an empty folder, `package` installed into it from the wheelhouse (by this pip:
    seeding each venv with its own pip costs more than the rest of the venv)."""
    base = empty_folder(artefacts.scratch, name)
    folder, home, venv = empty_folder(base, "work"), base / "home", base / "venv"
    timed(f"{name}: venv", [sys.executable, "-m", "venv", "--without-pip", venv], cwd=folder, env=outside_env(home))
    timed(f"{name}: pip install", [sys.executable, "-m", "pip", "--python", venv / "bin" / "python", "install", "-q",
                                   package], cwd=folder, env=artefacts.install_env(home))
    return Installed(name, venv / "bin" / "provision", venv / "bin" / "python", folder, home)


@pytest.fixture(scope="module")
def from_wheel(artefacts) -> Installed:
    return venv_install(artefacts, "wheel", artefacts.wheel)


@pytest.fixture(scope="module")
def from_sdist(artefacts) -> Installed:
    return venv_install(artefacts, "sdist", artefacts.sdist)


@pytest.fixture(scope="module")
def from_pipx(artefacts) -> Installed:
    base = empty_folder(artefacts.scratch, "pipx")
    folder, home = empty_folder(base, "work"), base / "home"
    pipx_env = {"PIPX_HOME": str(base / "pipx-home"), "PIPX_BIN_DIR": str(base / "bin"), "PIPX_MAN_DIR": str(base / "man")}
    # as README says: the lock as pip's constraints
    timed("pipx: install", [sys.executable, "-m", "pipx", "install", "--pip-args", f"--constraint {REPO / 'constraints.txt'}",
                            artefacts.wheel],
          cwd=folder, env={**artefacts.install_env(home), **pipx_env})
    venv = base / "pipx-home" / "venvs" / "vllm-provision"
    return Installed("pipx", base / "bin" / "provision", venv / "bin" / "python", folder, home)


@pytest.fixture(scope="module")
def host(lab):
    """One lab host (the TEST DOUBLE nvidia-smi on it) for every test of the module."""
    (booted,) = lab.boot_many([f"pkg{lab.boot_count}"])
    install_standin(booted)
    yield booted
    disconnect([Connection(booted.address, "root", 22, str(booted.ssh_key), str(booted.known_hosts))])
    lab.destroy(booted)


@pytest.fixture(scope="module", autouse=True)
def report_timings(request):
    yield
    plugins = request.config.pluginmanager
    reporter, capture = plugins.get_plugin("terminalreporter"), plugins.get_plugin("capturemanager")
    if TIMINGS and reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():  # past pytest's capture of the fixture's output
            reporter.write_line("\ninstall: " + ", ".join(f"{step} {seconds:.1f} s" for step, seconds in TIMINGS.items()))


def lab_spec(installed: Installed, host) -> Path:
    """The lab host's spec in the installation's folder: strict host keys against the lab's known_hosts."""
    return write_spec(installed.folder / "provision.yml", [host_entry(host)], [instance_entry(host, "chat", 8000)])


def applied_stats(output: str, host_name: str) -> dict[str, int]:
    """The apply summary's row for the host: ok, changed, failed, unreachable, skipped."""
    rows = [line for line in output.splitlines() if re.match(rf"^\W*{re.escape(host_name)}\W", line)]
    assert rows, f"no summary row for {host_name}:\n{output}"
    numbers = [int(cell) for cell in re.findall(r"\d+", rows[-1].split(host_name, 1)[1])]
    return dict(zip(("ok", "changed", "failed", "unreachable", "skipped"), numbers))


def recap(output: str, host_name: str) -> dict[str, int]:
    """ansible-playbook's PLAY RECAP line for the host."""
    line = re.search(rf"^{re.escape(host_name)}\s+:(.*)$", output, re.M)
    assert line, output[-3000:]
    return {key: int(value) for key, value in re.findall(r"(\w+)=(\d+)", line.group(1))}


# ------------------------------------------------------------------------------------------- the packages


def archive_names(artefacts: Artefacts) -> tuple[set[str], set[str]]:
    wheel = set(zipfile.ZipFile(artefacts.wheel).namelist())
    with tarfile.open(artefacts.sdist) as sdist:
        inside = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    return wheel, inside


def files_the_tool_runs() -> list[str]:
    """Every file of the package and of the content, as in this checkout (no byte code)."""
    found = []
    for top in ("provisioner", *CONTENT):
        path = REPO / top
        for item in [path] if path.is_file() else sorted(path.rglob("*")):
            if item.is_file() and "__pycache__" not in item.parts and item.suffix != ".pyc":
                found.append(str(item.relative_to(REPO)))
    return found


def test_the_wheel_and_the_sdist_carry_every_file_the_tool_runs(artefacts):
    wheel, sdist = archive_names(artefacts)
    needed = files_the_tool_runs()
    assert any(name.startswith("roles/") for name in needed) and "provisioner/vllm/profiles.yml" in needed
    in_wheel = {name if name.startswith("provisioner/") else f"provisioner/_content/{name}" for name in needed}
    assert sorted(in_wheel - wheel) == []
    assert sorted(set(needed) - sdist) == []
    for data in ("provisioner/vllm/profiles.yml", "provisioner/bench/loads.yml", "provisioner/audit/probes/http_probe.sh",
                 "provisioner/_content/playbooks/site.yml", "provisioner/_content/templates/spec.example.yml"):
        assert data in wheel, data
    metadata = zipfile.ZipFile(artefacts.wheel).read(f"vllm_provision-{VERSION}.dist-info/METADATA").decode()
    requires = re.findall(r"^Requires-Dist: (.*)$", metadata, re.M)
    core = [item for item in requires if "extra ==" not in item]
    assert not any(item.startswith("matplotlib") for item in core), core  # only in the extra `plot`
    assert "matplotlib~=3.11; extra == 'plot'" in requires, requires
    # compatible ranges, as pyproject.toml states them (the exact lock is constraints.txt, beside the package)
    ranges = {Requirement(item).name: Requirement(item).specifier for item in core}
    assert ranges == {Requirement(item).name: Requirement(item).specifier for item in PROJECT["project"]["dependencies"]}
    assert not any("==" in item for item in core), core
    assert "Project-URL: Source, https://github.com/vllm-provision/vllm-provision" in metadata


def test_the_installed_package_runs_from_its_venv_not_from_a_checkout(from_wheel, from_sdist, from_pipx):
    for installed in (from_wheel, from_sdist, from_pipx):
        where = run([installed.python, "-c", "import provisioner, provisioner.base.paths as p; print(provisioner.__file__); "
                     "print(p.CONTENT_ROOT)"], cwd=installed.folder, env=installed.env).stdout.split()
        site = installed.python.parent.parent
        assert all(Path(path).resolve().is_relative_to(site.resolve()) for path in where), (installed.name, where)
        assert where[1].endswith("provisioner/_content"), where
        matplotlib = run([installed.python, "-c", "import matplotlib"], cwd=installed.folder, env=installed.env, check=False)
        assert matplotlib.returncode == 1 and "No module named 'matplotlib'" in matplotlib.stderr, installed.name


def assert_version(installed: Installed) -> None:
    """`provision --version` answers with the package's version."""
    shown = installed("--version", check=False)
    assert shown.returncode == 0 and shown.stdout.startswith(f"vllm-provision {VERSION} ("), (installed.name, shown.stdout + shown.stderr)


def init_and_plan(installed: Installed) -> None:
    """`provision init` writes the example spec and the API key file it names; the untouched example plans, each
    part of it shown, rendered from the installed roles' templates, the key never."""
    spec = installed.folder / "provision.yml"
    written = installed("init", spec.name)
    assert spec.is_file() and spec.name in written.stdout, written.stdout
    example = yaml.safe_load(spec.read_text())
    (key_file,) = [installed.folder / entry["api_key_file"] for entry in example["instances"] if entry.get("api_key_file")]
    assert key_file.stat().st_mode & 0o777 == 0o600 and str(key_file.relative_to(installed.folder)) in written.stdout
    planned = installed("plan", *spec_args(spec))
    output = planned.stdout
    for entry in example["hosts"]:
        assert f"{entry['name']} ({entry['address']})" in output, output
    for instance in example["instances"]:
        assert f"vllm-{instance['name']}.service" in output, output
    assert "Managed by vllm-provision (role vllm_service)" in output and "/etc/sysctl.d/60-vllm-provision.conf" in output
    assert key_file.read_text().strip() not in output + planned.stderr


def test_the_wheel_answers_version_init_and_plan(from_wheel):
    assert_version(from_wheel)
    init_and_plan(from_wheel)


def test_the_sdist_answers_version_init_and_plan(from_sdist):
    assert_version(from_sdist)
    init_and_plan(from_sdist)


def test_pipx_answers_version_init_and_plan(from_pipx):
    assert_version(from_pipx)
    init_and_plan(from_pipx)


def test_bench_compare_without_the_plot_extra_prints_the_tables_and_how_to_get_plots(from_wheel):
    results = shutil.copytree(RECORDED_BENCH, from_wheel.folder / "bench-results")
    compared = from_wheel("bench", "compare", "conc-defaults", "conc-latency", "--results", results)
    assert "conc-defaults (reference) vs conc-latency" in compared.stdout and "+4.7 %" in compared.stdout
    assert ("no plot drawn: matplotlib is not installed — for plots: pipx inject vllm-provision matplotlib, "
            "or pip install 'vllm-provision[plot]'") in compared.stdout
    assert "Traceback" not in compared.stdout + compared.stderr and not list(results.glob("*.png"))


# ------------------------------------------------------------------------------ against the lab host


@pytest.fixture(scope="module")
def wheel_applied(from_wheel, host):
    """The wheel's `provision inventory` then `apply` on the lab host: (spec, inventory folder, apply's result)."""
    spec = lab_spec(from_wheel, host)
    inventory = from_wheel.folder / "inventory"
    started = time.monotonic()
    written = from_wheel("inventory", *spec_args(spec), "-o", inventory.name)
    TIMINGS["wheel: inventory"] = time.monotonic() - started
    assert (inventory / "hosts.yml").is_file(), written.stdout + written.stderr
    started = time.monotonic()
    applied = from_wheel("apply", *spec_args(spec), check=False)
    TIMINGS["wheel: apply"] = time.monotonic() - started
    return spec, inventory, applied


def test_the_wheel_writes_the_inventory_then_applies_and_audits_the_host(from_wheel, host, wheel_applied):
    spec, inventory, applied = wheel_applied
    assert applied.returncode == 0, applied.stdout + applied.stderr
    stats = applied_stats(applied.stdout, host.name)
    assert stats["failed"] == 0 and stats["unreachable"] == 0 and stats["changed"] > 0 and stats["ok"] > 10, stats
    assert host.ssh("systemctl is-active vllm-chat.service").stdout.strip() == "active"
    hosts = yaml.safe_load((inventory / "hosts.yml").read_text())
    assert host.name in json.dumps(hosts)

    started = time.monotonic()
    audited = from_wheel("audit", "spec", *spec_args(spec), "--json", "audit.json", check=False)
    TIMINGS["wheel: audit"] = time.monotonic() - started
    assert audited.returncode == 0, audited.stdout + audited.stderr
    checks = json.loads((from_wheel.folder / "audit.json").read_text())["hosts"][host.name]["checks"]
    statuses = {check["status"] for check in checks}
    assert len(checks) >= 40 and statuses <= {"passed", "n/a"} and "passed" in statuses, statuses


def test_the_sdist_audits_the_host_the_wheel_applied(from_sdist, host, wheel_applied):
    spec = lab_spec(from_sdist, host)
    started = time.monotonic()
    audited = from_sdist("audit", "spec", *spec_args(spec), "--json", "audit.json", check=False)
    TIMINGS["sdist: audit"] = time.monotonic() - started
    assert audited.returncode == 0, audited.stdout + audited.stderr
    checks = json.loads((from_sdist.folder / "audit.json").read_text())["hosts"][host.name]["checks"]
    assert len(checks) >= 40 and {check["status"] for check in checks} <= {"passed", "n/a"}


@dataclass
class CollectionUser:
    """A plain Ansible user: the tarball installed into an empty collections path, an empty folder to run
    in, an empty ansible.cfg, and ansible-playbook (the one pip installed with the wheel)."""

    folder: Path
    env: dict[str, str]
    ansible_bin: Path

    def playbook(self, inventory: Path, step: str, home: Path | None = None) -> subprocess.CompletedProcess:
        """ansible-playbook on the inventory; `home`: another $HOME, so no SSH master of an earlier run
        (~/.ansible/cp, kept 60 s) is reused."""
        env = {**self.env, "HOME": str(home)} if home else self.env
        return timed(step, [self.ansible_bin / "ansible-playbook", "-i", inventory / "hosts.yml",
                            "vllm_provision.gpu_host.site"], cwd=self.folder, env=env, check=False)


@pytest.fixture(scope="module")
def collection_user(artefacts, from_wheel) -> CollectionUser:
    """The one setting given, as a user's own environment: pipelining (Ansible's advice for speed; without
    it every task costs several SSH round trips more)."""
    base = empty_folder(artefacts.scratch, "collection-user")
    folder, collections, config = empty_folder(base, "work"), empty_folder(base, "collections"), base / "ansible.cfg"
    config.write_text("")
    env = outside_env(base / "home", ANSIBLE_CONFIG=str(config), ANSIBLE_COLLECTIONS_PATH=str(collections),
                      ANSIBLE_PIPELINING="True")
    ansible_bin = from_wheel.python.parent
    installed = timed("collection: install", [ansible_bin / "ansible-galaxy", "collection", "install", "-p", collections,
                                              artefacts.collection], cwd=folder, env=env)
    collection = collections / "ansible_collections" / "vllm_provision" / "gpu_host"
    assert (collection / "roles").is_dir() and (collection / "playbooks" / "site.yml").is_file(), installed.stdout
    assert not (collection / "provisioner").exists()
    # of the tests, only ansible-test's ignore file for the sanity tests (where ansible-test looks for it)
    shipped = sorted(str(path.relative_to(collection)) for path in (collection / "tests").rglob("*") if path.is_file())
    assert shipped == ["tests/sanity/ignore-2.19.txt"], shipped
    return CollectionUser(folder, env, ansible_bin)


def test_the_collection_tarball_converges_the_host_with_plain_ansible_playbook(collection_user, host, wheel_applied):
    """The site playbook, found by its name, changes nothing on the host the wheel applied."""
    _, inventory, applied = wheel_applied
    assert applied.returncode == 0, applied.stdout + applied.stderr
    played = collection_user.playbook(inventory, "collection: ansible-playbook")
    assert played.returncode == 0, played.stdout[-6000:] + played.stderr[-3000:]
    counts = recap(played.stdout, host.name)
    assert counts["failed"] == 0 and counts["unreachable"] == 0 and counts["ok"] > 10, counts
    assert counts["changed"] == 0, played.stdout[-6000:]  # what the wheel's apply set is what the collection sets
    # the spec has no gateway and no monitoring host: their plays match no host, and ansible-playbook says no warning
    assert "Could not match supplied host pattern" not in played.stdout + played.stderr, played.stderr[-3000:]


def lowest_ansible_core() -> str:
    """The lowest ansible-core the collection says it supports (meta/runtime.yml's requires_ansible, `>=X.Y.Z`)."""
    requires = yaml.safe_load((REPO / "meta" / "runtime.yml").read_text())["requires_ansible"]
    found = re.fullmatch(r">=\s*(\d+\.\d+\.\d+)", requires.strip())
    assert found, f"requires_ansible {requires!r}: the test installs its lower bound, written >=X.Y.Z"
    return found.group(1)


def test_the_lowest_supported_ansible_core_converges_the_host_with_the_collection(artefacts, collection_user, host,
                                                                                   wheel_applied):
    """The supported range is what CI runs: the lowest ansible-core meta/runtime.yml admits, in a venv of its own
    (from PyPI, beside the lock's newest one the other tests use), runs the collection's site playbook on the host the
    wheel applied: every task runs (a changed=0 run still evaluates each), and changes nothing."""
    _, inventory, applied = wheel_applied
    assert applied.returncode == 0, applied.stdout + applied.stderr
    version = lowest_ansible_core()
    base = empty_folder(artefacts.scratch, f"ansible-core-{version}")
    # a short $HOME: ssh's master socket (~/.ansible/cp/vp-<16 hex>.<16 more>) must fit a Unix socket's 107 bytes,
    # which a home under CI's pytest folder did not
    venv, home = base / "venv", Path(tempfile.mkdtemp(prefix="vp-home-"))
    timed(f"ansible-core {version}: venv", [sys.executable, "-m", "venv", "--without-pip", venv], cwd=base,
          env=outside_env(home))
    timed(f"ansible-core {version}: pip install", [sys.executable, "-m", "pip", "--python", venv / "bin" / "python",
                                                   "install", "-q", f"ansible-core=={version}"], cwd=base,
          env=outside_env(home))
    shown = run([venv / "bin" / "ansible-playbook", "--version"], cwd=base, env=outside_env(home))
    assert f"[core {version}]" in shown.stdout, shown.stdout
    lowest = CollectionUser(collection_user.folder, collection_user.env, venv / "bin")
    try:
        played = lowest.playbook(inventory, f"ansible-core {version}: ansible-playbook", home=home)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    assert played.returncode == 0, played.stdout[-6000:] + played.stderr[-3000:]
    counts = recap(played.stdout, host.name)
    assert counts["failed"] == 0 and counts["unreachable"] == 0 and counts["ok"] > 10, counts
    assert counts["changed"] == 0, played.stdout[-6000:]


def test_plain_ansible_playbook_on_the_inventory_still_checks_host_keys(collection_user, from_wheel, host):
    """No ansible.cfg and no environment of ours: the inventory alone keeps ssh strict. A spec whose
    known_hosts file lacks the host's key gives an inventory that ansible-playbook cannot connect with."""
    unknown = from_wheel.folder / "empty_known_hosts"
    unknown.write_text("")
    entry = host_entry(host)
    entry["ssh"]["known_hosts"] = str(unknown)
    spec = write_spec(from_wheel.folder / "unknown-key.yml", [entry], [instance_entry(host, "chat", 8000)])
    inventory = from_wheel.folder / "inventory-unknown-key"
    from_wheel("inventory", *spec_args(spec), "-o", inventory.name)

    played = collection_user.playbook(inventory, "collection: refused host", home=empty_folder(from_wheel.folder, "home-2"))
    assert played.returncode != 0
    assert recap(played.stdout, host.name)["unreachable"] == 1, played.stdout[-3000:]
    assert "Host key verification failed" in played.stdout + played.stderr, played.stdout[-3000:]
    assert unknown.read_text() == ""  # nothing learnt on the way
