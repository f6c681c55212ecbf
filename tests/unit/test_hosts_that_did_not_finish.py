"""After an apply, the hosts that did not finish are connected to once more (provisioner/apply/hosts.py,
ask_hosts_that_did_not_finish), over real ssh: a host on this machine answers (it runs here), a loopback
port nothing listens on refuses. A host whose task failed and that does not answer now is lost (a shutdown
stops the task before it closes ssh); one that answers keeps its failure."""

from __future__ import annotations

import socket

from provisioner.apply.events import HostStats, TaskResult
from provisioner.apply.hosts import ask_hosts_that_did_not_finish
from provisioner.apply.playbook import ApplyResult
from provisioner.cli.apply_view import host_outcome
from provisioner.spec import validate_spec


def closed_port() -> int:
    """A loopback port nothing listens on (bound then closed: ssh's connection to it is refused)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def spec_of(hosts: dict[str, int], user: str = "root"):
    """Hosts on 127.0.0.1 by ssh port: 22 runs here, another port is reached over ssh."""
    return validate_spec({
        "version": 1,
        "hosts": [{"name": name, "address": "127.0.0.1", "ssh": {"port": port, "user": user, "become": user != "root"}}
                  for name, port in hosts.items()],
        "instances": [],
    }, check_files=False)


def failed(host: str, message: str = "MODULE FAILURE: rc 143") -> TaskResult:
    return TaskResult(host, "vllm_service", "Write the config files", "failed", message)


def test_a_failed_host_that_does_not_answer_now_is_lost_and_one_that_answers_keeps_its_failure():
    spec = spec_of({"answers": 22, "down": closed_port(), "gone": closed_port()})
    result = ApplyResult(rc=2, stats={"answers": HostStats(ok=5, failed=1), "down": HostStats(ok=12, failed=1),
                                      "gone": HostStats(ok=3, unreachable=1)},
                         problems=[failed("answers"), failed("down"),
                                   TaskResult("gone", "vllm_service", "Write the units", "unreachable",
                                              "the connection closed while a task ran")])
    ask_hosts_that_did_not_finish(spec, result)

    assert result.lost == ["down", "gone"]
    assert result.stats["answers"] == HostStats(ok=5, failed=1)
    assert result.stats["down"] == HostStats(ok=12, failed=0, unreachable=1)
    answers, down, gone = result.problems
    assert (answers.status, answers.message) == ("failed", "MODULE FAILURE: rc 143")
    assert down.status == "unreachable"
    assert down.message.startswith("its task failed (MODULE FAILURE: rc 143), then it stopped answering: "
                                   "connected to again: connection refused"), down.message
    assert gone.message.startswith("the connection closed while a task ran; connected to again: connection refused"), \
        gone.message


def test_a_rollout_reports_a_host_that_failed_as_it_went_down_as_lost_mid_batch():
    spec = spec_of({"down": closed_port()})
    result = ApplyResult(rc=2, stats={"down": HostStats(ok=12, failed=1)}, problems=[failed("down")])
    ask_hosts_that_did_not_finish(spec, result)
    result.turns = {"down": object()}  # it had its turn (host_outcome reads only that there was one)
    assert host_outcome(result, "down").startswith(
        "lost mid-batch (unreachable at vllm_service : Write the config files): its task failed (MODULE FAILURE")


def test_a_host_that_answers_but_refuses_the_command_answers():
    """A user other than root goes through `sudo -n`, which fails where sudo wants a password (or, on this
    machine, is not installed): the host answered, so its failure stands."""
    spec = spec_of({"answers": 22}, user="ops")
    result = ApplyResult(rc=2, stats={"answers": HostStats(ok=5, failed=1)}, problems=[failed("answers")])
    ask_hosts_that_did_not_finish(spec, result)
    assert result.lost == [] and result.problems[0].status == "failed"
