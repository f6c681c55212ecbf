"""provisioner.apply turns the run's events (plugins/callback/provision_events.py) into task results and per-host stats."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from provisioner.apply.events import (
    HostProgress,
    HostStats,
    TaskResult,
    stats_from_progress,
    stats_of_run,
    task_result,
    unified_diff,
)
from provisioner.apply.playbook import _interrupted_with_parent, died_of_a_signal


def event(name: str, host: str = "gpu1", res: dict | None = None, **data) -> dict:
    return {"event": name, "event_data": {"host": host, "task": "Write the units", "role": "vllm_service",
                                          "res": res or {}, **data}}


def test_a_changed_ok_is_reported_as_changed():
    result = task_result(event("runner_on_ok", res={"changed": True}))
    assert (result.host, result.status, result.label) == ("gpu1", "changed", "vllm_service : Write the units")


def test_an_unchanged_ok_stays_ok():
    assert task_result(event("runner_on_ok", res={"changed": False})).status == "ok"


def test_a_failure_carries_its_message_and_ignore_flag():
    result = task_result(event("runner_on_failed", res={"msg": "vLLM is not installed at /opt/vllm/venv/bin/vllm"},
                               ignore_errors=True))
    assert result.status == "failed"
    assert result.message == "vLLM is not installed at /opt/vllm/venv/bin/vllm"
    assert result.ignored is True


def test_unreachable_uses_the_ssh_message():
    result = task_result(event("runner_on_unreachable", host="ghost",
                               res={"msg": "Failed to connect to the host via ssh: Connection timed out"}))
    assert (result.host, result.status) == ("ghost", "unreachable")
    assert "Connection timed out" in result.message


def test_non_result_events_are_ignored():
    assert task_result({"event": "playbook_on_task_start", "event_data": {}}) is None
    assert task_result(event("runner_item_on_failed")) is None


def test_stats_count_changed_apart_from_ok():
    stats = stats_of_run({"event": "playbook_on_stats", "event_data": {
        "ok": {"gpu1": 40, "gpu2": 12}, "changed": {"gpu1": 15}, "failures": {"gpu2": 1},
        "dark": {"ghost": 1}, "skipped": {"gpu1": 19}, "processed": {"gpu1": 1, "gpu2": 1, "ghost": 1}}})
    assert list(stats) == ["ghost", "gpu1", "gpu2"]
    assert (stats["gpu1"].ok, stats["gpu1"].changed, stats["gpu1"].skipped) == (25, 15, 19)
    assert stats["gpu1"].succeeded and not stats["gpu2"].succeeded and not stats["ghost"].succeeded
    assert stats["ghost"].unreachable == 1


def test_diff_entries_render_as_unified_diffs():
    text = unified_diff({"before": "vm.swappiness = 60\n", "after": "vm.swappiness = 1\n",
                         "before_header": "/etc/sysctl.d/60-vllm-provision.conf", "after_header": "rendered"})
    assert "-vm.swappiness = 60\n" in text and "+vm.swappiness = 1\n" in text
    assert unified_diff({"prepared": "+ line"}) == "+ line"


def test_a_failed_loop_says_why_each_failed_item_failed():
    """A template whose `validate` refused the new file, in a loop over instances."""
    event = {"event": "runner_on_failed", "event_data": {"host": "ws1", "role": "vllm_service",
             "task": "Write the config files", "res": {"msg": "One or more items failed", "results": [
                 {"changed": False, "_ansible_item_label": "reranker"},
                 {"failed": True, "_ansible_item_label": "chat", "msg": "failed to validate", "exit_status": 2,
                  "stderr": "usage: vllm serve [model_tag] [options]\nvllm: error: unrecognized arguments: --disable-cuda-graph\n"},
             ]}}}
    result = task_result(event)
    assert result.status == "failed"
    assert result.message == ("chat: failed to validate: usage: vllm serve [model_tag] [options] / "
                              "vllm: error: unrecognized arguments: --disable-cuda-graph")


# --- recorded events ------------------------------------------------------------------------------------
# tests/fixtures/ansible-events/*.json are REAL events of the collection's event callback, recorded from
# `apply --check --diff` runs on a lab host (tests/lab/record_events.py; see the folder's README), trimmed
# to a few tasks.

import json  # noqa: E402
from pathlib import Path  # noqa: E402

EVENTS = Path(__file__).resolve().parent.parent / "fixtures" / "ansible-events"


def recorded(name: str) -> dict[str, object]:
    """task name -> its TaskResult, read as run_playbook reads the events, in order."""
    results = [task_result(event) for event in json.loads((EVENTS / f"{name}.json").read_text())]
    return {result.task: result for result in results if result is not None}


def rendered(result) -> str:
    return "".join(unified_diff(entry) for entry in result.diffs)


def test_a_loop_templates_diff_is_shown_labelled_with_its_destination():
    """The template tasks loop: their diffs are in the items' results, headed by a temp file."""
    units = recorded("fresh-host-check-diff")["Write the units"]
    text = rendered(units)
    assert units.status == "changed"
    assert text.startswith("--- /etc/systemd/system/vllm-chat.service (now)\n"
                           "+++ /etc/systemd/system/vllm-chat.service (after apply)\n")
    assert "+ExecStart=/opt/vllm/venvs/0.25.0/bin/vllm serve --config /etc/vllm/chat.yaml\n" in text
    assert "/root/.ansible/tmp" not in text
    config = rendered(recorded("fresh-host-check-diff")["Write the config files"])
    assert "+++ /etc/vllm/chat.yaml (after apply)\n" in config


def test_a_new_file_of_a_plain_template_is_labelled_with_its_destination():
    text = rendered(recorded("fresh-host-check-diff")["Write the sysctl drop-in"])
    assert "+++ /etc/sysctl.d/60-vllm-provision.conf (after apply)\n" in text and "+vm.swappiness = 1\n" in text
    assert "/root/.ansible/tmp" not in text


def test_a_drifted_unit_file_shows_the_line_apply_puts_back():
    text = rendered(recorded("drifted-host-check-diff")["Write the units"])
    assert "-ExecStart=/opt/vllm/venvs/0.25.0/bin/vllm serve --config /etc/vllm/chat.yaml --enforce-eager\n" in text
    assert "+ExecStart=/opt/vllm/venvs/0.25.0/bin/vllm serve --config /etc/vllm/chat.yaml\n" in text


def test_the_censored_env_files_count_as_changed_and_show_nothing_of_their_content():
    """no_log: Ansible censors the result whole for every callback, keeping only "changed" (and a few status keys);
    the task's line says it changed, and role vllm_service names the files in the task after it."""
    for name in ("fresh-host-check-diff", "drifted-host-check-diff"):  # a new file; a file whose mode drifted
        env_files = recorded(name)["Write the env files"]
        assert env_files.status == "changed", name
        assert env_files.diffs == [] and rendered(env_files) == ""


def test_directories_and_modes_render_as_attribute_changes():
    directories = rendered(recorded("fresh-host-check-diff")["Create the configuration and probe directories"])
    assert "/etc/vllm: state absent -> directory\n" in directories
    assert unified_diff({"before": {"path": "/etc/vllm/chat.env", "mode": "0644"},
                         "after": {"path": "/etc/vllm/chat.env", "mode": "0600"}, "dest": "/etc/vllm/chat.env"}
                        ) == "/etc/vllm/chat.env: mode 0644 -> 0600\n"


def test_check_modes_would_and_warnings_are_kept_as_notes():
    results = recorded("fresh-host-check-diff")
    assert results["Report the /dev/shm (re)mount check mode would do"].notes == [
        "would remount /dev/shm with size=1G (live: 2527608832 bytes)"]
    assert results["Say which new instances would be enabled (check mode)"].notes == ["would enable vllm-chat.service"]


def test_an_item_lost_mid_loop_is_named_with_the_reason_in_network_terms():
    """Ansible's loop result says only "One or more items failed"; an item whose host was lost is unreachable,
    not failed (recorded: Write the units, link down mid-loop)."""
    result = task_result(event("runner_on_unreachable", res={"msg": "All items completed", "results": [
        {"item": "a", "changed": True},
        {"item": "b", "unreachable": True, "msg": "Task failed: Mitogen was disconnected from the remote "
                                                 "environment while a call was in-progress. If you feel this is in "
                                                 "error, please file a bug."}]}))
    assert result.status == "unreachable"
    assert result.message.startswith("b: the connection closed while a task ran")
    assert "file a bug" not in result.message and "a:" not in result.message


def test_a_module_warning_is_kept_as_a_note():
    result = task_result(event("runner_on_ok", task_action="vllm_provision.gpu_host.apply_lock", res={
        "changed": False, "warnings": ["took over the apply lock of alice from bastion-2 (pid 7), since 2026-12-05 "
                                       "07:00:00 UTC: that run is gone"]}))
    assert result.notes == ["warning: took over the apply lock of alice from bastion-2 (pid 7), since 2026-12-05 "
                            "07:00:00 UTC: that run is gone"]


def test_how_far_each_host_got_is_read_from_the_events_for_a_run_stopped_before_ansible_counted():
    progress = HostProgress()
    for status, task in (("ok", "Read"), ("changed", "Write the config files"), ("skipped", "Say"), ("ok", "Restart")):
        progress.read(TaskResult("gpu1", "vllm_service", task, status))
    progress.running = "vllm_service : Enable"
    assert (progress.done, progress.skipped, progress.changed) == (4, 1, ["vllm_service : Write the config files"])
    problems = [TaskResult("gpu1", "", "x", "failed")]
    progress.read(problems[0])
    assert stats_from_progress("gpu1", progress, problems) == HostStats(ok=2, changed=1, failed=1, unreachable=0, skipped=1)
    assert progress.running == ""  # a result ends the task it began


def signals_ignored(pid: int) -> set[int]:
    mask = int(next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                    if line.startswith("SigIgn:")).split()[1], 16)
    return {number for number in range(1, 65) if mask & (1 << (number - 1))}


def test_ansible_playbook_takes_sigint_though_provision_was_started_ignoring_it():
    """A shell script's `provision apply &` starts provision with SIGINT ignored; what stops ansible-playbook (the
    second Ctrl-C, provision's end) is SIGINT, so ansible-playbook gets SIGINT's default back."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        child = subprocess.Popen(["sleep", "30"], stdin=subprocess.DEVNULL, start_new_session=True,
                                 preexec_fn=_interrupted_with_parent(os.getpid()))
        plain = subprocess.Popen(["sleep", "30"], stdin=subprocess.DEVNULL, start_new_session=True)
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        assert signal.SIGINT in signals_ignored(plain.pid)  # what it would have inherited
        assert signal.SIGINT not in signals_ignored(child.pid)
        os.kill(child.pid, signal.SIGINT)
        assert child.wait(timeout=10) == -signal.SIGINT
    finally:
        for process in (child, plain):
            process.kill()
            process.wait()


def test_a_sigint_that_killed_an_ansible_worker_is_an_interruption_not_an_error():
    """Recorded (lab, 2026-12-06): SIGINT sent to ansible-playbook alone; its handler raised KeyboardInterrupt in a
    worker holding a lock, and it exited 1, not 99."""
    tail = ["TASK [vllm_provision.gpu_host.sysctl : Check the kernel parameters are well formed] ***",
            "Exception ignored in: <function _releaseLock at 0x7fc0f145df80>",
            "Traceback (most recent call last):",
            '  File "/usr/lib/python3.11/logging/__init__.py", line 237, in _releaseLock',
            "    raise KeyboardInterrupt()",
            "KeyboardInterrupt: ",
            "[ERROR]: A worker was found in a dead state"]
    assert died_of_a_signal(tail)
    assert not died_of_a_signal([line for line in tail if "KeyboardInterrupt" not in line])
