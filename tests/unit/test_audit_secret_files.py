"""Row `secrets readable by others` (provisioner/audit/checks/secret_files.py): a managed file or a drop-in
of a vLLM unit that holds a secret (by the rules, or a value the spec declares, found by its digest) and that
others may read fails, naming the file and its mode, never the secret."""

from __future__ import annotations

import base64
import json
from types import SimpleNamespace

import pytest

from provisioner.audit.checks import secret_files as checks
from provisioner.audit.checks.vllm_service import dropin_modes, parse_unit
from provisioner.audit.engine import Output, host_commands
from provisioner.audit.expectations import spec_targets
from provisioner.audit.registry import Case
from provisioner.base.paths import ROLES_DIR
from provisioner.spec import load_spec
from tests.unit.audit_rows import run_row
from tests.unit.conftest import instance, spec_data, write_spec

DECLARED = "conn-planted-value-81d2"  # declared under a name no rule finds secret
DROPIN = "/etc/systemd/system/vllm-chat.service.d/override.conf"


def row(target: dict, facts) -> tuple[str, str, str, str]:
    status, recorded = run_row(checks.secrets_readable_by_others, Case("ws4070", target), facts)
    return recorded["check"], recorded["expected"], recorded["actual"], status


def facts_with(dropin: str = "", mode: str = "644", managed: dict | None = None):
    outputs = {"unit0": Output("LoadState=loaded\n", 0), "unit_env0": Output("", 1),
               "dropins0": Output(f"{DROPIN}\n{base64.b64encode(dropin.encode()).decode()}\n" if dropin else "", 0),
               "dropin_modes0": Output(f"{mode} {DROPIN}\n" if dropin else "", 0)}
    return SimpleNamespace(units={"vllm-chat.service": parse_unit(0, outputs)}, managed_files=managed or {})


@pytest.fixture
def target(tmp_path, monkeypatch):
    """A spec target whose instance declares DB_CONN from the controller's environment."""
    monkeypatch.setenv("VP_TEST_AUDIT_CONN", DECLARED)
    data = spec_data(instances=[instance("chat", 8000, env={"DB_CONN": {"env": "VP_TEST_AUDIT_CONN"}},
                                         options={"max-model-len": 4096})])
    (found,) = spec_targets(load_spec(write_spec(tmp_path / "provision.yml", data)))
    return found.expected


def test_a_world_readable_dropin_holding_a_secret_fails_naming_file_and_mode(target):
    assert row(target, facts_with("[Service]\nEnvironment=HF_TOKEN=hf-in-a-dropin-77\n")) == (
        "secrets readable by others", "none (a file that holds a secret is for its owner alone: 0600)",
        f"{DROPIN} (0644) holds a secret", "failed")


def test_a_declared_value_under_any_name_is_found_by_its_digest(target):
    check, _, actual, status = row(target, facts_with(f"[Service]\nEnvironment=DB_CONN={DECLARED}\n"))
    assert (actual, status) == (f"{DROPIN} (0644) holds a secret", "failed")
    assert row({}, facts_with(f"[Service]\nEnvironment=DB_CONN={DECLARED}\n"))[3] == "passed"  # no digests: no secret


def test_a_secret_for_its_owner_alone_and_a_dropin_without_one_pass(target):
    assert row(target, facts_with("[Service]\nEnvironment=HF_TOKEN=hf-x-1\n", mode="600"))[2:] == ("none", "passed")
    assert row(target, facts_with("[Service]\nEnvironment=HF_HUB_OFFLINE=1\n"))[2:] == ("none", "passed")


def test_a_managed_file_readable_by_others_that_holds_a_secret_fails(target):
    managed = {"/etc/vllm/chat.yaml": (("0644", "root:root"), f"model: m\napi-key: {DECLARED}x\n"),
               "/etc/vllm/other.yaml": (("0600", "root:root"), "api-key: k-only-root\n")}
    assert row(target, facts_with(managed=managed))[2:] == ("/etc/vllm/chat.yaml (0644) holds a secret", "failed")


def test_the_suite_is_handed_digests_never_the_secrets_and_reads_the_dropins_modes(target):
    assert DECLARED not in json.dumps(target)
    assert target["secret_digests"] and all(len(digest) == 2 for digest in target["secret_digests"])
    assert "dropin_modes0" in host_commands(target)
    assert dropin_modes(Output(f"644 {DROPIN}\n600 /run/systemd/system/x.d/a b.conf\n", 0)) == {
        DROPIN: "0644", "/run/systemd/system/x.d/a b.conf": "0600"}


def test_a_program_is_searched_for_declared_secrets_only(target):
    """The rules read configuration: role vllm_service's wait-ready (0755) has `key = key_of_unit(...)` in its code."""
    script = (ROLES_DIR / "vllm_service/files/wait-ready").read_text()
    managed = {"/usr/local/lib/vllm-provision/wait-ready": (("0755", "root:root"), script)}
    assert row(target, facts_with(managed=managed))[2:] == ("none", "passed")
    managed = {"/usr/local/bin/x": (("0755", "root:root"), f"#!/bin/sh\nexport DB_CONN={DECLARED}\n")}
    assert row(target, facts_with(managed=managed))[2:] == ("/usr/local/bin/x (0755) holds a secret", "failed")
