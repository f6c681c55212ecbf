"""The vLLM layer on real systemd test hosts: vllm_install from a wheelhouse (offline: the hosts have no
network), the instance's `vllm serve --config` file, the flag check with the installed vLLM's parser,
and the readiness probe.

The wheelhouse holds the TEST DOUBLE vLLM wheel (tests/doubles/vllm_package; no GPU here): the real
package's console script and parser module paths, its `vllm serve` options read from the real
version's catalog, a stand-in server. The real vLLM runs on the H200 (tests/fixtures/vllm/h200-runs).
"""

from __future__ import annotations

import json
import shlex
import urllib.request
from pathlib import Path

import yaml

from provisioner.apply.events import TaskResult
from provisioner.apply.hosts import apply_spec
from provisioner.apply.playbook import run_playbook
from provisioner.audit.text import show_blocks, shown_argv
from provisioner.base.paths import ROLES_DIR
from provisioner.fleet.inventory import write_inventory
from provisioner.spec import load_spec
from tests.integration.conftest import audit_failures, disk_state
from tests.lab.specs import MODEL, host_entry, install_standin, instance_entry, standin_wheelhouse, write_spec

UNIT = "vllm-chat.service"
# `systemctl show` as the unit tests' TEST DOUBLE of systemctl answers it (tests/unit/test_vllm_units.py)
RECORDED_SHOW = Path(__file__).resolve().parents[1] / "fixtures" / "systemd" / "show" / "vllm-chat.service.active"
CONFIG = "/etc/vllm/chat.yaml"
CACHES = "/var/lib/vllm/cache"  # <vllm_service_home>/cache: the units' compile caches, a folder per vLLM version
REMOVE_OLD_VERSIONS = "Remove the venvs and compile caches of versions neither running nor previous"
NO_START = "RuntimeError: CUDA driver version is insufficient for CUDA runtime version"  # a vLLM that cannot start
# an instance setting that stops it at start: the stand-in's own switch (tests/doubles/vllm_package), as a bad
# VLLM_ATTENTION_BACKEND stops the real vLLM
BAD_SETTING = {"STANDIN_FAILS_AT_START": "ValueError: Invalid attention backend: 'NO_SUCH_BACKEND'"}
SECRET = "sk-layer-rollback-5150"
KEPT = "/etc/vllm/previous"


def process_of(host, port: int = 8000) -> dict:
    with urllib.request.urlopen(f"http://{host.address}:{port}/standin/process", timeout=5) as response:
        return json.load(response)


def spec_for(host, path: Path, version: str = "0.25.0", cuda: str | None = None, fails_at_start: str | None = None,
             name: str = "chat", **instance_extra):
    """The host's spec with `version` of vLLM (its `cuda` build: the wheelhouse holds that build's wheel; with
    `fails_at_start`, a vLLM that cannot start)."""
    entry = host_entry(host)
    package = version + ("+cu" + cuda.replace(".", "") if cuda else "")
    wheelhouse = standin_wheelhouse(package, fails_at_start=fails_at_start)
    entry["vllm"] = {**entry["vllm"], "version": version, "cuda": cuda, "wheelhouse": str(wheelhouse)}
    return load_spec(write_spec(path, [entry], [instance_entry(host, name, 8000, share=0.9, **instance_extra)]))


def main_pid(host) -> str:
    return host.ssh(f"systemctl show -p MainPID --value {UNIT}").stdout.strip()


def compile_into_caches(host) -> set[str]:
    """What the running unit's vLLM leaves once it compiled (the stand-in compiles nothing): a file in each
    cache folder its environment names (VLLM_CACHE_ROOT, TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR), written
    by the service user. Returns the folders."""
    environment = host.ssh(f"systemctl show -p Environment --value {UNIT}").stdout.split()
    folders = {value for name, _, value in (word.partition("=") for word in environment)
               if name in ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    script = 'for folder; do mkdir -p "$folder" && echo compiled > "$folder/artifact"; done'
    host.ssh(f"runuser -u vllm -- sh -c {shlex.quote(script)} sh {shlex.join(sorted(folders))}")
    return folders


def cache_folders(host) -> list[str]:
    return host.ssh(f"ls {CACHES}").stdout.split()


def removed(results: list[TaskResult]) -> set[str]:
    """What the run's removal of old versions removed (check mode: would remove), path by path."""
    (removal,) = [result for result in results if result.role == "vllm_install" and result.task == REMOVE_OLD_VERSIONS]
    return {diff["dest"] for diff in removal.diffs if diff.get("after", {}).get("state") == "absent"}


def test_install_from_a_wheelhouse_check_mode_idempotence_and_an_upgrade(boot, tmp_path):
    (host,) = boot(1)
    install_standin(host)
    spec = spec_for(host, tmp_path / "spec.yml")

    before = disk_state(host)
    checked = apply_spec(spec, check=True)
    assert checked.succeeded and checked.changed > 0
    assert disk_state(host) == before  # check mode: nothing written

    results: list[TaskResult] = []
    assert apply_spec(spec, on_result=results.append).succeeded
    assert host.ssh("/opt/vllm/venvs/0.25.0/bin/vllm --version").stdout.strip() == "0.25.0"
    assert host.ssh("test -e /opt/vllm/wheelhouse-0.25.0; echo $?").stdout.strip() == "1"  # removed once installed
    installed = next(result for result in results if result.role == "vllm_install" and result.task.startswith("Install vLLM"))
    assert installed.status == "changed"
    process = process_of(host)
    assert process["argv"][1:] == ["serve", "--config", CONFIG] and process["version"] == "0.25.0"
    # what the server parsed from its config file: the instance's flags
    assert (process["options"]["max_model_len"], process["options"]["block_size"]) == (4096, 16)
    assert yaml.safe_load(host.ssh(f"cat {CONFIG}").stdout)["model"] == MODEL

    # the unit keeps its compile caches per version, in <home>/cache/<version>
    assert compile_into_caches(host) == {f"{CACHES}/0.25.0/{folder}" for folder in ("vllm", "inductor", "triton")}
    again = apply_spec(spec)
    assert again.succeeded and again.changed == 0
    assert cache_folders(host) == ["0.25.0"]

    upgraded = spec_for(host, tmp_path / "spec-0.33.yml", version="0.33.0")
    pid = main_pid(host)
    assert apply_spec(upgraded).succeeded
    assert host.ssh("/opt/vllm/venvs/0.33.0/bin/vllm --version").stdout.strip() == "0.33.0"
    assert process_of(host)["version"] == "0.33.0" and main_pid(host) != pid  # restarted on the new vLLM
    compile_into_caches(host)
    assert apply_spec(upgraded).changed == 0
    assert cache_folders(host) == ["0.25.0", "0.33.0"]  # the running version's and the previous one's

    # the CUDA 12.9 build of the same version (for drivers below 580): pip's local label, a venv of its own.
    # The switch removes 0.25.0, neither running nor previous now: its venv and its caches; and the caches of
    # a version whose venv went before (an earlier build of the roles left them)
    host.ssh(f"runuser -u vllm -- mkdir -p {CACHES}/0.20.0/triton")
    cu129 = spec_for(host, tmp_path / "spec-0.33-cu129.yml", version="0.33.0", cuda="12.9")
    old_version = {"/opt/vllm/venvs/0.25.0", f"{CACHES}/0.25.0", f"{CACHES}/0.20.0"}
    checked: list[TaskResult] = []
    assert apply_spec(cu129, check=True, diff=True, on_result=checked.append).succeeded
    assert removed(checked) == old_version  # check mode names each removal ...
    assert cache_folders(host) == ["0.20.0", "0.25.0", "0.33.0"]  # ... and removes nothing
    pid = main_pid(host)
    applied: list[TaskResult] = []
    assert apply_spec(cu129, diff=True, on_result=applied.append).succeeded
    assert removed(applied) == old_version  # what check mode said
    assert host.ssh("/opt/vllm/venvs/0.33.0+cu129/bin/vllm --version").stdout.strip() == "0.33.0+cu129"
    assert process_of(host)["version"] == "0.33.0+cu129" and main_pid(host) != pid
    assert host.ssh("ls /opt/vllm/venvs").stdout.split() == ["0.33.0", "0.33.0+cu129"]
    compile_into_caches(host)
    assert apply_spec(cu129).changed == 0
    assert cache_folders(host) == ["0.33.0", "0.33.0+cu129"]  # the previous version keeps its caches for a rollback
    assert host.ssh(f"cat {CACHES}/0.33.0/inductor/artifact").stdout.strip() == "compiled"


def test_a_version_that_did_not_get_ready_goes_with_its_caches(boot, tmp_path):
    """A rollback (vllm_service's tasks/rollback.yml, then vllm_install's discard.yml): the new version's venv
    and its folder of caches go, so that the next try starts afresh; the running version keeps its caches."""
    (host,) = boot(1)
    install_standin(host)
    assert apply_spec(spec_for(host, tmp_path / "spec.yml")).succeeded
    compile_into_caches(host)
    # what the new version's start leaves there (the stand-in dies before it would compile)
    host.ssh(f"runuser -u vllm -- mkdir -p {CACHES}/0.33.0/vllm")
    broken = spec_for(host, tmp_path / "broken.yml", version="0.33.0", fails_at_start=NO_START)

    run = apply_spec(broken)

    assert not run.succeeded
    assert any("did not get ready" in problem.message for problem in run.problems), run.problems
    assert process_of(host)["version"] == "0.25.0"  # rolled back
    assert host.ssh("ls /opt/vllm/venvs").stdout.split() == ["0.25.0"]
    assert cache_folders(host) == ["0.25.0"]


def test_a_flag_the_installed_vllm_rejects_never_reaches_the_unit(boot, tmp_path):
    """Plain Ansible (no spec check in front): the installed vLLM's parser refuses the new config file
    before it replaces the old one; the running server is left alone."""
    (host,) = boot(1)
    install_standin(host)
    spec = spec_for(host, tmp_path / "spec.yml")
    assert apply_spec(spec).succeeded
    config_before, pid = host.ssh(f"cat {CONFIG}").stdout, main_pid(host)

    inventory = tmp_path / "inventory"
    write_inventory(spec, inventory)
    host_vars = inventory / "host_vars" / f"{host.name}.yml"
    variables = yaml.safe_load(host_vars.read_text())
    variables["vllm_service_instances"][0]["options"]["disable-cuda-graph"] = True  # seed 3's invented flag
    host_vars.write_text(yaml.safe_dump(variables))
    results: list[TaskResult] = []
    run = run_playbook(inventory, on_result=results.append)

    assert not run.succeeded
    failed = next(result for result in results if result.status == "failed")
    assert (failed.role, failed.task) == ("vllm_service", "Write the config files")
    assert "unrecognized arguments: --disable-cuda-graph" in failed.message
    assert host.ssh(f"cat {CONFIG}").stdout == config_before
    assert main_pid(host) == pid and host.ssh(f"systemctl is-active {UNIT}").stdout.strip() == "active"


def test_the_service_role_alone_says_where_vllm_is_missing(boot, tmp_path):
    (host,) = boot(1)
    install_standin(host)
    spec = spec_for(host, tmp_path / "spec.yml")
    inventory = tmp_path / "inventory"
    write_inventory(spec, inventory)
    playbook = tmp_path / "service.yml"
    playbook.write_text(f"- hosts: vllm_hosts\n  gather_facts: false\n  roles: [{ROLES_DIR / 'vllm_service'}]\n")
    results: list[TaskResult] = []

    run = run_playbook(inventory, playbook=playbook, on_result=results.append)

    assert not run.succeeded
    failed = next(result for result in results if result.status == "failed")
    assert "vLLM is not installed at /opt/vllm/venvs/0.25.0/bin/vllm" in failed.message


def file_states(host, *paths: str) -> dict[str, str]:
    """Each file's sha256, owner and mode (never its content: the env file holds the API key)."""
    lines = host.ssh("for f in " + " ".join(paths) + "; do echo \"$f $(sha256sum < $f | cut -c1-16) $(stat -c '%U %a' $f)\"; done").stdout
    return {path: state for path, state in (line.split(" ", 1) for line in lines.splitlines())}


def test_a_setting_that_does_not_get_ready_goes_back_to_the_files_that_did(boot, tmp_path):
    """Config rollback (vllm_service's tasks/transaction.yml): the new env and config file of an instance that
    does not get ready are replaced by the ones it last got ready with (kept in /etc/vllm/previous/ by the run
    they got ready in), it restarts on them, and the run fails saying so; the spec fixed, the next apply converges."""
    (host,) = boot(1)
    install_standin(host)
    key_file = tmp_path / "chat.key"
    key_file.write_text(SECRET + "\n")
    good = spec_for(host, tmp_path / "good.yml", api_key_file=str(key_file))
    assert apply_spec(good).succeeded
    files = ("/etc/vllm/chat.env", CONFIG, f"/etc/systemd/system/{UNIT}")
    ready = file_states(host, *files)
    kept = (f"{KEPT}/chat.env", f"{KEPT}/chat.yaml", f"{KEPT}/{UNIT}")
    # the files as they got ready are kept beside, as the originals (the env file 0600 root)
    assert list(file_states(host, *kept).values()) == list(ready.values())
    assert host.ssh(f"stat -c '%U %a' {KEPT}").stdout.strip() == "root 700"
    # the real systemd answers module vllm_units' read in the shape the unit tests' double answers it
    (shown,) = show_blocks(host.ssh(f"systemctl show --property Id,LoadState,ActiveState,SubState,ExecStart -- {UNIT}").stdout)
    (recorded,) = show_blocks(RECORDED_SHOW.read_text())
    assert set(shown) == set(recorded) and shown_argv(shown["ExecStart"]) == shown_argv(recorded["ExecStart"])
    assert [shown[key] for key in ("Id", "LoadState", "ActiveState", "SubState")] == ["vllm-chat.service", "loaded", "active", "running"]

    # a bad setting (an Environment= line of the unit), and a change of an option with it: the unit and the
    # config file change, the env file does not
    bad_spec = spec_for(host, tmp_path / "bad.yml", api_key_file=str(key_file), env=BAD_SETTING,
                        options={"max-model-len": 4096, "block-size": 16, "max-num-seqs": 32})
    before = disk_state(host)
    assert apply_spec(bad_spec, check=True).succeeded  # check mode verifies nothing (nothing restarts) ...
    assert disk_state(host) == before  # ... and changes nothing
    pid = main_pid(host)
    results: list[TaskResult] = []
    run = apply_spec(bad_spec, on_result=results.append)

    assert not run.succeeded
    messages = " | ".join(problem.message for problem in run.problems)
    assert ("chat did not get ready with its new config (chat: ValueError: Invalid attention backend: 'NO_SUCH_BACKEND'): "
            "restored the previous config file and unit of chat (ready again); fix instances[chat]") in messages, messages
    assert SECRET not in messages and all(SECRET not in result.message for result in results)
    assert file_states(host, *files) == ready  # restored: content, owner, mode
    assert host.ssh(f"systemctl is-active {UNIT}").stdout.strip() == "active" and main_pid(host) != pid
    process = process_of(host)  # the old config again
    assert "max_num_seqs" not in process["options"] or process["options"]["max_num_seqs"] != 32
    assert "STANDIN_FAILS_AT_START" not in process["env"]
    assert list(file_states(host, *kept).values()) == list(ready.values())  # still the ones that got ready

    # the spec fixed (the option change kept, the bad setting gone): converges, then changes nothing
    fixed = spec_for(host, tmp_path / "fixed.yml", api_key_file=str(key_file),
                     options={"max-model-len": 4096, "block-size": 16, "max-num-seqs": 32})
    assert apply_spec(fixed).succeeded
    assert process_of(host)["options"]["max_num_seqs"] == 32
    assert file_states(host, f"{KEPT}/chat.yaml")[f"{KEPT}/chat.yaml"] == file_states(host, CONFIG)[CONFIG]  # committed
    again = apply_spec(fixed)
    assert again.succeeded and again.changed == 0
    assert audit_failures(tmp_path / "fixed.yml") == {host.name: {}}

    # an instance no longer listed goes with its kept files
    assert apply_spec(spec_for(host, tmp_path / "renamed.yml", name="talk", api_key_file=str(key_file))).succeeded
    assert host.ssh(f"ls /etc/vllm {KEPT}").stdout.split() == [
        "/etc/vllm:", "previous", "talk.env", "talk.yaml", f"{KEPT}:", "talk.env", "talk.yaml", "vllm-talk.service"]
    assert host.ssh(f"test -e /etc/systemd/system/{UNIT}; echo $?").stdout.strip() == "1"


def test_a_new_version_and_a_bad_setting_in_one_run_both_go_back(boot, tmp_path):
    """A version rollback and a config rollback composed: the instance back on the vLLM it ran and on its
    previous files; the new venv removed."""
    (host,) = boot(1)
    install_standin(host)
    assert apply_spec(spec_for(host, tmp_path / "spec.yml")).succeeded
    files = ("/etc/vllm/chat.env", CONFIG, f"/etc/systemd/system/{UNIT}")
    ready = file_states(host, *files)

    run = apply_spec(spec_for(host, tmp_path / "both.yml", version="0.33.0", env=BAD_SETTING,
                              options={"max-model-len": 4096, "block-size": 16, "max-num-seqs": 32}))

    assert not run.succeeded
    messages = " | ".join(problem.message for problem in run.problems)
    assert ("vLLM 0.33.0 did not get ready on chat (chat: ValueError: Invalid attention backend: 'NO_SUCH_BACKEND'): "
            "rolled back chat to the vLLM in /opt/vllm/venvs/0.25.0 and restored the previous config file and unit of chat "
            "(ready again)") in messages, messages
    assert file_states(host, *files) == ready
    assert process_of(host)["version"] == "0.25.0" and "STANDIN_FAILS_AT_START" not in process_of(host)["env"]
    assert host.ssh("ls /opt/vllm/venvs").stdout.split() == ["0.25.0"]
