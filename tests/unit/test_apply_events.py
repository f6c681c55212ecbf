"""provisioner.apply turns ansible-runner's events into task results and per-host stats."""

from __future__ import annotations

from provisioner.apply import _stats, task_result, unified_diff


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
    stats = _stats({"event": "playbook_on_stats", "event_data": {
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
