"""Module vllm_units (plugins/modules/vllm_units.py) as Ansible runs it: ad hoc, on this machine, against a file tree
in a temporary folder (`root`), with `systemctl` replaced on PATH by a TEST DOUBLE that answers `systemctl show`
with systemd's own output (tests/fixtures/systemd/show/UNIT.STATE, one block per unit as systemd 252 prints
them): this machine runs no systemd; the lab tests run the module against the real one (test_vllm_layer.py,
test_multinode.py, test_containers.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from provisioner.audit.text import show_blocks, shown_argv
from provisioner.base.paths import COLLECTION, collections_dir

SHOWN = Path(__file__).resolve().parents[1] / "fixtures" / "systemd" / "show"
HEADER = "# Managed by vllm-provision (role vllm_service); local changes are overwritten.\n"

# TEST DOUBLE of systemctl: `show --property P -- UNIT...` prints each unit's recorded block, blank lines between
# them; the state of UNIT is the first line of $STATES/UNIT, which each call consumes while more lines follow
# (a unit that settles: activating, then active). It records each call's arguments in $STATES/calls.
SYSTEMCTL = r"""#!/bin/sh
echo "$*" >> "$STATES/calls"
[ "$1" = show ] || exit 1
while [ "$1" != -- ]; do shift; done; shift
first=1
for unit; do
  state=$(head -n 1 "$STATES/$unit")
  if [ "$(wc -l < "$STATES/$unit")" -gt 1 ]; then tail -n +2 "$STATES/$unit" > "$STATES/$unit.rest"; mv "$STATES/$unit.rest" "$STATES/$unit"; fi
  [ $first = 1 ] || echo; first=0
  cat "$SHOWN/$unit.$state"
done
"""


def write(root: Path, path: str, text: str) -> Path:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    return target


def units_double(tmp_path: Path, **states: list[str]) -> Path:
    """systemctl on PATH, each unit vllm-NAME.service answering `states[NAME]` one call after another."""
    folder = tmp_path / "states"
    folder.mkdir()
    for name, answers in states.items():
        (folder / f"vllm-{name}.service").write_text("\n".join(answers) + "\n")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "systemctl").write_text(SYSTEMCTL)
    (tmp_path / "bin" / "systemctl").chmod(0o755)
    return folder


def run_module(tmp_path: Path, *options: str, **arguments) -> dict:
    ansible = Path(sys.executable).parent / "ansible"
    tree = tmp_path / "tree"
    done = subprocess.run(
        [str(ansible), "localhost", "-c", "local", "-e", f"ansible_python_interpreter={sys.executable}", "-t", str(tree),
         "-m", f"{COLLECTION}.vllm_units", "-a", json.dumps({"root": str(tmp_path / "root"), "poll": 0.01, **arguments}),
         *options],
        env={**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "STATES": str(tmp_path / "states"),
             "SHOWN": str(SHOWN), "ANSIBLE_COLLECTIONS_PATH": str(collections_dir(tmp_path / "collections")),
             "ANSIBLE_REMOTE_TMP": str(tmp_path / "ansible-tmp"), "ANSIBLE_LOCALHOST_WARNING": "false", "ANSIBLE_NOCOLOR": "1"},
        capture_output=True, text=True, timeout=120,
    )
    return {**json.loads((tree / "localhost").read_text()), "failed": done.returncode != 0, "stdout": done.stdout}


def calls(tmp_path: Path) -> list[str]:
    return (tmp_path / "states" / "calls").read_text().splitlines()


@pytest.fixture
def host(tmp_path) -> Path:
    """A host's tree as role vllm_service leaves it: two venv units, a quadlet, a compose project, a unit masked by
    hand (a link: not ours), one of another tool, an instance no longer listed, and the files kept for a rollback."""
    root = tmp_path / "root"
    write(root, "/etc/systemd/system/vllm-chat.service", HEADER + "[Service]\n")
    write(root, "/etc/systemd/system/vllm-gone.service", HEADER + "[Service]\n")
    write(root, "/etc/systemd/system/vllm-other.service", "[Service]\nExecStart=/bin/true\n")  # no header: not ours
    (root / "etc/systemd/system/vllm-masked.service").symlink_to("/dev/null")
    write(root, "/etc/containers/systemd/vllm-pod.container", HEADER + "[Container]\n")
    write(root, "/etc/vllm/web.compose.yaml", HEADER + "services: {}\n")
    write(root, "/etc/vllm/old.compose.yaml", HEADER + "services: {}\n")
    write(root, "/etc/vllm/chat.env", "VLLM_API_KEY=x\n")
    write(root, "/etc/vllm/old.yaml", HEADER + "model: m\n")
    (root / "etc/systemd/system/multi-user.target.wants").mkdir(parents=True)
    (root / "etc/systemd/system/multi-user.target.wants/vllm-chat.service").symlink_to("/etc/systemd/system/vllm-chat.service")
    (root / "etc/systemd/system/multi-user.target.wants/vllm-masked.service").symlink_to("/dev/null")
    for kept in ("chat.env", "chat.yaml", "vllm-chat.service", "vllm-pod.container", "pod.yaml"):
        write(root, f"/etc/vllm/previous/{kept}", "kept\n")
    write(root, "/opt/vllm/venvs/0.25.0/lib/python3.11/site-packages/vllm-0.25.0.dist-info/METADATA",
          "Metadata-Version: 2.1\nName: vllm\nVersion: 0.25.0\n")
    return root


def test_one_read_finds_the_role_s_files_the_units_states_and_what_each_runs(tmp_path, host):
    units_double(tmp_path, chat=["active"], pod=["active"], new=["not-found"], gone=["failed"])

    read = run_module(tmp_path, "--check", instances=["chat", "pod", "new", "gone", "web"], units=["chat", "pod", "new", "gone"])

    assert not read["failed"] and not read["changed"], read["stdout"]
    assert read["written"] == ["/etc/containers/systemd/vllm-pod.container", "/etc/systemd/system/vllm-chat.service",
                               "/etc/systemd/system/vllm-gone.service", "/etc/vllm/old.compose.yaml",
                               "/etc/vllm/web.compose.yaml"]
    assert read["names"] == ["chat", "gone", "old", "pod", "web"]
    assert [(file["name"], file["kind"], file["path"]) for file in read["files"]] == [
        ("pod", "quadlet", "/etc/containers/systemd/vllm-pod.container"),
        ("chat", "unit", "/etc/systemd/system/vllm-chat.service"), ("gone", "unit", "/etc/systemd/system/vllm-gone.service"),
        ("chat", "env file", "/etc/vllm/chat.env"), ("old", "compose file", "/etc/vllm/old.compose.yaml"),
        ("old", "config file", "/etc/vllm/old.yaml"), ("web", "compose file", "/etc/vllm/web.compose.yaml")]
    assert (read["stale"], read["stale_compose"]) == (["old"], ["old"])
    assert read["enabled"] == ["chat", "masked"]  # a masked unit whose link stayed is still enabled at boot
    assert (read["active"], read["not_ready"]) == (["chat", "pod"], ["new", "gone"])
    chat = read["units"]["chat"]
    assert (chat["state"], chat["enabled"], chat["load_state"]) == ("active/running", True, "loaded")
    assert (chat["bin"], chat["version"], chat["config"]) == ("/opt/vllm/venvs/0.25.0/bin/vllm", "0.25.0", "/etc/vllm/chat.yaml")
    pod = read["units"]["pod"]
    assert (pod["bin"], pod["version"], pod["config"]) == (None, None, "/etc/vllm/pod.yaml")  # podman runs the image's
    assert read["units"]["new"]["state"] == "inactive/dead" and read["units"]["new"]["argv"] == []
    assert read["units"]["gone"]["state"] == "failed/failed"
    assert "web" not in read["units"] and "old" not in read["units"]  # compose projects: no unit
    assert calls(tmp_path) == ["show --property Id,LoadState,ActiveState,SubState,ExecStart,ExecMainStartTimestampMonotonic -- "
                               "vllm-chat.service vllm-pod.service vllm-new.service vllm-gone.service"]  # one round trip
    assert "old" not in read["units"]  # a stale one is not read: it is stopped next
    assert {(kept["name"], kept["kind"], kept["dest"]) for kept in read["previous"]} == {
        ("chat", "env file", "/etc/vllm/chat.env"), ("chat", "config file", "/etc/vllm/chat.yaml"),
        ("chat", "unit", "/etc/systemd/system/vllm-chat.service"), ("pod", "config file", "/etc/vllm/pod.yaml"),
        ("pod", "quadlet", "/etc/containers/systemd/vllm-pod.container")}


def test_a_failed_start_is_not_waited_for_but_a_start_in_progress_is(tmp_path, host):
    """Single-node: `activating/auto-restart` (its start failed) is settled, not ready; `activating/start-post`
    (the readiness probe) is waited for until it settles."""
    units_double(tmp_path, chat=["start", "start", "active"], gone=["auto-restart"])

    read = run_module(tmp_path, instances=["chat", "gone"], units=["chat", "gone"], wait=True, timeout=60)

    assert read["settled"] and len(calls(tmp_path)) == 3, calls(tmp_path)
    assert read["units"]["chat"]["state"] == "active/running"
    assert read["units"]["gone"]["state"] == "activating/auto-restart" and read["not_ready"] == ["gone"]


def test_a_node_of_a_multinode_instance_is_waited_for_through_auto_restart(tmp_path, host):
    units_double(tmp_path, big=["auto-restart", "auto-restart", "active"])

    read = run_module(tmp_path, instances=["big"], units=["big"], nnodes={"big": 2}, wait=True, timeout=60)

    assert read["settled"] and read["active"] == ["big"] and len(calls(tmp_path)) == 3


def test_the_deadline_returns_the_units_as_they_are(tmp_path, host):
    units_double(tmp_path, big=["auto-restart"])

    read = run_module(tmp_path, instances=["big"], units=["big"], nnodes={"big": 2}, wait=True, timeout=1)

    assert not read["failed"] and not read["settled"]
    assert read["not_ready"] == ["big"] and len(calls(tmp_path)) > 1


def test_without_wait_one_read(tmp_path, host):
    units_double(tmp_path, chat=["start", "active"])

    read = run_module(tmp_path, instances=["chat"], units=["chat"])

    assert not read["settled"] and read["not_ready"] == ["chat"] and len(calls(tmp_path)) == 1


def test_systemctl_show_s_output_as_the_audit_reads_it_too():
    """One parser for the module and the audit (plugins/module_utils/systemd_show.py)."""
    blocks = show_blocks((SHOWN / "vllm-chat.service.active").read_text() + "\n" + (SHOWN / "vllm-new.service.not-found").read_text())
    assert [block["Id"] for block in blocks] == ["vllm-chat.service", "vllm-new.service"]
    assert shown_argv(blocks[0]["ExecStart"]) == ["/opt/vllm/venvs/0.25.0/bin/vllm", "serve", "--config", "/etc/vllm/chat.yaml"]
    assert shown_argv(blocks[1]["ExecStart"]) == []


def test_the_module_s_documentation_parses():
    doc = subprocess.run([str(Path(sys.executable).parent / "ansible-doc"), "--type", "module", "--json", f"{COLLECTION}.vllm_units"],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(collections_dir(Path(os.environ.get("TMPDIR", "/tmp")) / "vllm-units-doc"))})
    assert doc.returncode == 0, doc.stderr
    documented = json.loads(doc.stdout)[f"{COLLECTION}.vllm_units"]
    assert documented["doc"]["attributes"]["check_mode"]["support"] == "full"
    assert {"written", "units", "previous", "not_ready"} <= set(documented["return"])


def report(rollback: dict, not_ready: list[str]) -> str:
    """The failure role vllm_service's tasks/report.yml raises on the fact vllm_service_rollback, as Ansible renders it."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    from provisioner.validation.roles import role_tasks

    (task,) = [task for task in role_tasks("vllm_service") if task.get("name") == "Fail on a rollback"]
    values = {"vllm_service_rollback": rollback, "_vllm_service_not_ready": not_ready}
    templar = Templar(loader=DataLoader(), variables=values)
    for name, text in task["vars"].items():
        values[name] = templar.template(trust_as_template(text))
    return Templar(loader=DataLoader(), variables=values).template(trust_as_template(task["ansible.builtin.fail"]["msg"]))


def test_the_failure_names_what_went_back_and_why():
    config = {"version": None, "back_to": None, "instances": ["chat", "code"],
              "restored": {"chat": ["config file", "unit"], "code": ["env file"]},
              "errors": {"chat": "ValueError: bad backend", "code": "OSError: no key"}}
    assert report(config, []) == (
        "chat, code did not get ready with their new config (chat: ValueError: bad backend; code: OSError: no key): "
        "restored the previous config file and unit of chat; the previous env file of code (ready again); "
        "fix instances[chat], instances[code] (their options, env, GPUs or container) or what stops it, then apply again.")
    version = {"version": "0.33.0", "back_to": "/opt/vllm/venvs/0.25.0", "instances": ["chat"], "restored": {},
               "errors": {"chat": "RuntimeError: CUDA driver version is insufficient"}}
    assert report(version, ["chat"]) == (
        "vLLM 0.33.0 did not get ready on chat (chat: RuntimeError: CUDA driver version is insufficient): rolled back "
        "chat to the vLLM in /opt/vllm/venvs/0.25.0 (still not ready: chat); fix the version (hosts[].vllm.version) or "
        "what stops it, then apply again.")
