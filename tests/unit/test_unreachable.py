"""provisioner/base/unreachable.py: a failed or lost connection said in network terms, from what ssh, Ansible's
ssh plugin and Mitogen really printed on lab hosts (tests/integration/test_faults.py makes each happen)."""

from __future__ import annotations

import pytest

from provisioner.base.unreachable import LOST_AFTER_S, cause_of, explain, liveness_options

# (what was printed, the cause we name, ssh's own line we keep) — recorded on lab hosts (10.88.3.0/24)
RECORDED = [
    ("Task failed: Mitogen was disconnected from the remote environment while a call was in-progress. If you "
     "feel this is in error, please file a bug. Original error was: the respondent Context has disconnected",
     "closed", None),
    ("Failed to connect to the host via ssh: ssh: connect to host 10.88.3.10 port 22: Connection refused",
     "refused", "connect to host 10.88.3.10 port 22: Connection refused"),
    ("root@10.88.3.10: Permission denied (publickey,password).",
     "authentication", "root@10.88.3.10: Permission denied (publickey,password)."),
    ("Task failed: SSH password was requested, but none specified", "authentication", None),
    ("ssh: connect to host 10.88.3.11 port 22: No route to host",
     "no route", "connect to host 10.88.3.11 port 22: No route to host"),
    ("ssh: connect to host 10.88.3.11 port 22: Connection timed out",
     "no answer", "connect to host 10.88.3.11 port 22: Connection timed out"),
    ("Timeout, server 10.88.3.11 not responding.\r\n", "silent", "Timeout, server 10.88.3.11 not responding."),
    ("@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@\n"
     "@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @\nHost key verification failed.",
     "host key", None),
]


@pytest.mark.parametrize(("raw", "kind", "ssh_line"), RECORDED)
def test_each_recorded_failure_is_named_in_network_terms_with_ssh_own_line(raw, kind, ssh_line):
    cause = cause_of(raw)
    assert cause is not None and cause.kind == kind
    said = explain(raw)
    assert said.startswith(cause.said)
    assert "file a bug" not in said and "Mitogen" not in said
    assert said.endswith(f"— ssh: {ssh_line.strip()}") if ssh_line else said == cause.said


def test_a_silent_host_is_said_with_the_seconds_it_was_waited_for():
    assert f"no answer for {LOST_AFTER_S} s" in explain("Timeout, server 10.88.3.11 not responding.")
    assert LOST_AFTER_S <= 30  # issue 33: a lost host named within 30 s


def test_text_we_do_not_know_is_passed_through_as_it_is():
    assert explain("sudo: a password is required") == "sudo: a password is required"
    assert explain("") == ""


def test_liveness_options_are_ssh_keyword_value_pairs():
    assert liveness_options() == ["ServerAliveInterval 5", "ServerAliveCountMax 3"]
