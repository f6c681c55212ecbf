"""A rolling apply's options, what the site playbook gets from them, each host's turn read from the run's
events, and the report of what was done where (the rollout itself runs on lab hosts:
tests/integration/test_rollout.py)."""

from __future__ import annotations

import json

import pytest
import yaml

from provisioner.apply.events import HostStats, TaskResult
from provisioner.apply.playbook import ApplyResult
from provisioner.base.paths import PLAYBOOKS_DIR
from provisioner.base.rollout import HOSTS_PLAY, HostTurn, Rollout, Timeline
from provisioner.cli.apply_view import rollout_rows
from tests.unit.test_cli_controls import invoke, two_hosts


@pytest.mark.parametrize("rollout, problem", [
    (Rollout(batch="0"), "--batch 0: give a number of hosts (1 or more) or a percentage of them (1%-100%)"),
    (Rollout(batch="101%"), "--batch 101%: give a number of hosts (1 or more) or a percentage of them (1%-100%)"),
    (Rollout(batch="two"), "--batch two: give a number of hosts (1 or more) or a percentage of them (1%-100%)"),
    (Rollout(max_fail="-1"), "--max-fail -1: give a number of hosts (0 or more) or a percentage of them (0%-100%)"),
    (Rollout(max_fail="150%"), "--max-fail 150%: give a number of hosts (0 or more) or a percentage of them (0%-100%)"),
    (Rollout(canary=0), "--canary 0: give 1 or more hosts"),
    (Rollout(min_serving="-1"), "--min-serving -1: give a number of replicas (0 or more) or a percentage of a route's "
                                "replicas (0%-100%)"),
    (Rollout(min_serving="120%"), "--min-serving 120%: give a number of replicas (0 or more) or a percentage of a "
                                  "route's replicas (0%-100%)"),
])
def test_bad_rollout_options_name_the_option_and_the_fix(rollout, problem):
    assert rollout.problems() == [problem]


def test_the_site_playbook_gets_the_batches_a_canary_first_and_the_failures_allowed():
    assert Rollout().problems() == []
    assert json.loads(Rollout().extra_vars()) == {"rollout_batches": [1, 1], "rollout_max_fail": 0,
                                                  "rollout_min_serving": 1}
    assert json.loads(Rollout(batch="25%", max_fail="10%", min_serving="50%").extra_vars()) == {
        "rollout_batches": [1, "25%"], "rollout_max_fail": "10%", "rollout_min_serving": "50%"}
    assert json.loads(Rollout(min_serving="0").extra_vars())["rollout_min_serving"] == 0  # an outage, accepted


def test_the_hosts_play_runs_in_the_rollouts_batches_and_nothing_else_changes_without_one():
    take, hosts_play, gateways_play, monitoring_play, give_back = yaml.safe_load(
        (PLAYBOOKS_DIR / "site.yml").read_text(encoding="utf-8"))
    assert hosts_play["name"] == HOSTS_PLAY  # the play Timeline counts the batches of
    assert hosts_play["serial"] == "{{ rollout_batches | default([], true) or 0 }}"  # 0: every host at once
    turn = [task for task in hosts_play["pre_tasks"] + hosts_play["post_tasks"] if "rollout" in str(task)]
    assert [task["ansible.builtin.include_role"]["tasks_from"] for task in turn] == ["renew.yml", "start.yml",
                                                                                      "finish.yml"]
    # the lock: every host of the run, before the first batch and after the last play; before it, on every host
    # at once, the one check that changes nothing: the vault-encrypted secrets decrypt (role vllm_service)
    check, *take_tasks = take["tasks"]
    assert check["ansible.builtin.include_role"] == {"name": "vllm_provision.gpu_host.vllm_service",
                                                     "tasks_from": "secrets-check.yml", "apply": {"tags": ["always"]}}
    assert [(play["hosts"], tasks[0]["ansible.builtin.import_role"]["tasks_from"])
            for play, tasks in ((take, take_tasks), (give_back, give_back["tasks"]))] == [
        ("vllm_hosts:gateway:monitoring", "acquire.yml"), ("vllm_hosts:gateway:monitoring", "release.yml")]
    assert "serial" not in take
    assert all(task["when"] == "rollout_batches | default([], true) | length > 0" for task in turn)
    assert "serial" not in gateways_play  # after the batches, once
    assert "serial" not in monitoring_play


def event(name: str, **data) -> dict:
    return {"event": name, "event_data": data}


def test_each_hosts_turn_is_its_batch_and_its_first_and_last_event():
    timeline = Timeline()
    timeline.read(event("playbook_on_play_start", play=HOSTS_PLAY))
    timeline.read(event("runner_on_start", host="gpu1"))
    timeline.read(event("runner_on_ok", host="gpu1"))
    timeline.read(event("playbook_on_play_start", play=HOSTS_PLAY))  # the next batch
    timeline.read(event("runner_on_ok", host="gpu2"))
    timeline.read(event("playbook_on_play_start", play="Provision the gateways"))
    timeline.read(event("runner_on_ok", host="gpu2"))  # the gateways' play: not the host's turn
    assert {host: turn.batch for host, turn in timeline.turns.items()} == {"gpu1": 1, "gpu2": 2}
    first, second = timeline.turns["gpu1"], timeline.turns["gpu2"]
    assert first.started <= first.ended <= second.started == second.ended


def test_the_report_says_what_was_done_where_and_which_hosts_the_rollout_never_reached():
    result = ApplyResult(rc=2, stats={"gpu1": HostStats(ok=70, changed=3), "gpu2": HostStats(ok=60, failed=1)},
                         turns={"gpu1": HostTurn(1, 1.0, 20.0), "gpu2": HostTurn(2, 20.1, 35.5)},
                         problems=[TaskResult("gpu2", "vllm_service", "Fail on units that did not become active",
                                              "failed", "vllm-chat-1.service did not become active")])
    assert rollout_rows(result, ["gpu3", "gpu2", "gpu1"]) == [
        {"host": "gpu1", "batch": 1, "from": 1.0, "to": 20.0, "outcome": "changed 3"},
        {"host": "gpu2", "batch": 2, "from": 20.1, "to": 35.5,
         "outcome": "failed: vllm_service : Fail on units that did not become active: vllm-chat-1.service did not "
                    "become active"},
        {"host": "gpu3", "batch": None, "from": None, "to": None,
         "outcome": "not reached: the rollout stopped before its batch"}]


def test_the_report_gives_each_hosts_true_state_rolled_back_lost_refused_stopped_interrupted():
    turns = {name: HostTurn(batch, batch * 10.0, batch * 10.0 + 9) for batch, name in enumerate(
        ["gpu1", "gpu2", "gpu3", "gpu4", "gpu5"], start=1)}
    result = ApplyResult(
        rc=130, interrupted=True, turns=turns,
        stats={"gpu1": HostStats(ok=60, failed=1), "gpu2": HostStats(ok=5, unreachable=1),
               "gpu3": HostStats(ok=2, failed=1), "gpu4": HostStats(ok=1, failed=1)},
        problems=[TaskResult("gpu1", "vllm_service", "Fail on a rollback", "failed", "vLLM 0.33.0 did not get ready"),
                  TaskResult("gpu2", "vllm_service", "Write the units", "unreachable", "ssh: no route to host"),
                  TaskResult("gpu3", "rollout", "Check each route keeps enough replicas serving while this batch "
                             "changes", "failed", "route public-0 would keep 0 of its 2 replicas serving"),
                  TaskResult("gpu4", "rollout", "Stop the rollout when earlier batches failed", "failed", "stopped")])
    outcomes = {row["host"]: row["outcome"] for row in rollout_rows(result, ["gpu1", "gpu2", "gpu3", "gpu4", "gpu5",
                                                                             "gpu6"])}
    assert outcomes == {
        "gpu1": "rolled back: vLLM 0.33.0 did not get ready",
        "gpu2": "lost mid-batch (unreachable at vllm_service : Write the units): ssh: no route to host",
        "gpu3": "refused before any drain: route public-0 would keep 0 of its 2 replicas serving",
        "gpu4": "not reached: the rollout stopped before its batch",
        "gpu5": "interrupted during its turn",  # a turn, no stats: Ctrl-C came during it
        "gpu6": "not reached: the run was interrupted before its batch"}


@pytest.mark.parametrize("args, message", [
    (["--batch", "2"], "--batch, --max-fail and --min-serving say how a rolling apply goes — add --rolling"),
    (["--min-serving", "0"], "--batch, --max-fail and --min-serving say how a rolling apply goes — add --rolling"),
    (["--rolling", "--min-serving", "all"], "--min-serving all: give a number of replicas (0 or more) or a "
                                            "percentage of a route's replicas (0%-100%)"),
    (["--rolling", "--batch", "0"], "--batch 0: give a number of hosts (1 or more) or a percentage of them (1%-100%)"),
    (["--rolling", "--max-fail", "x"], "--max-fail x: give a number of hosts (0 or more) or a percentage of them (0%-100%)"),
])
def test_bad_rolling_options_exit_2_before_any_host(tmp_path, args, message):
    result = invoke("apply", *args, "--spec", two_hosts(tmp_path))
    assert result.exit_code == 2, result.output
    assert result.output.startswith(message), result.output
