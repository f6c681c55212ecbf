"""provisioner/base/secrets.py: every form a secret takes in a command line, an environment or a file is redacted;
what is no secret stays as it was."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ElementTree

import pytest

from provisioner.audit.report import host_table, write_json, write_junit
from provisioner.audit.runner import CheckResult, HostReport
from provisioner.base.secrets import (
    REDACTED,
    is_secret_name,
    redact,
    redact_argv,
    redact_data,
    redact_environment,
    shown_command,
)
from provisioner.bench.results import Run, RunSet

R = REDACTED


@pytest.mark.parametrize(("argv", "shown"), [
    # vLLM's --api-key takes one or more values (nargs='+'): all of them, up to the next option
    (["vllm", "serve", "m", "--api-key", "k1", "k2", "--port", "1"],
     ["vllm", "serve", "m", "--api-key", R, R, "--port", "1"]),
    (["vllm", "serve", "m", "--api-key", "k1", "k2", "k3"], ["vllm", "serve", "m", "--api-key", R, R, R]),
    (["vllm", "serve", "--api-key=k1", "m"], ["vllm", "serve", f"--api-key={R}", "m"]),
    (["vllm", "serve", "--api_key", "k1", "--host", "::"], ["vllm", "serve", "--api_key", R, "--host", "::"]),
    (["vllm", "serve", "m", "--hf-token", "hf_x", "--port", "1"], ["vllm", "serve", "m", "--hf-token", R, "--port", "1"]),
    (["env", "VLLM_API_KEY=k1", "HF_HOME=/h", "vllm", "serve"], ["env", f"VLLM_API_KEY={R}", "HF_HOME=/h", "vllm", "serve"]),
    (["bash", "-c", "exec vllm serve m --api-key k1 k2 --port 1"], ["bash", "-c", f"exec vllm serve m --api-key {R} {R} --port 1"]),
    (["sh", "-c", "VLLM_API_KEY='k 1' vllm serve m; echo done"], ["sh", "-c", f"VLLM_API_KEY='{R}' vllm serve m; echo done"]),
    # no secret: as it was
    (["vllm", "serve", "m", "--model", "m", "--port", "1", "--ssl-keyfile", "/k.pem", "--max-num-batched-tokens", "8"],
     ["vllm", "serve", "m", "--model", "m", "--port", "1", "--ssl-keyfile", "/k.pem", "--max-num-batched-tokens", "8"]),
])
def test_the_values_of_secret_flags_and_variables_are_redacted_in_an_argv(argv, shown):
    assert redact_argv(argv) == shown


def test_a_shown_command_keeps_every_other_word():
    assert shown_command(["vllm", "serve", "--model", "m", "--api-key", "k", "--port", "1"]) == (
        f"vllm serve --model m --api-key {R} --port 1")


@pytest.mark.parametrize(("text", "shown"), [
    ("vllm serve m --api-key k1 k2 --port 1", f"vllm serve m --api-key {R} {R} --port 1"),
    ('vllm serve m --api-key "k 1" --port 1', f'vllm serve m --api-key "{R}" --port 1'),
    ("vllm serve m --api-key 'k1' 'k2'", f"vllm serve m --api-key '{R}' '{R}'"),
    ("vllm serve m --api-key=k1 --port 1", f"vllm serve m --api-key={R} --port 1"),
    ("ExecStart=/bin/bash -c 'exec vllm serve m --api-key=k4 --port 1'",
     f"ExecStart=/bin/bash -c 'exec vllm serve m --api-key={R} --port 1'"),
    ("ExecStart=/v/vllm serve m \\\n  --api-key \\\n  k1 \\\n  --port 1", f"ExecStart=/v/vllm serve m \\\n  --api-key \\\n  {R} \\\n  --port 1"),
    ("x --api-key k1; echo done && y --api-key=k2| z", f"x --api-key {R}; echo done && y --api-key={R}| z"),
    # a unit's Environment= (as written, and as `systemctl show` shows it), env files, export
    ("Environment=VLLM_API_KEY=k3", f"Environment=VLLM_API_KEY={R}"),
    ('Environment="HF_TOKEN=hf 1" CUDA_DEVICE_ORDER=PCI_BUS_ID', f'Environment="HF_TOKEN={R}" CUDA_DEVICE_ORDER=PCI_BUS_ID'),
    ("# managed\nVLLM_API_KEY=k3\nHUGGING_FACE_HUB_TOKEN=hf2\nHF_HOME=/h\n",
     f"# managed\nVLLM_API_KEY={R}\nHUGGING_FACE_HUB_TOKEN={R}\nHF_HOME=/h\n"),
    ("export MY_SERVICE_SECRET=s1; export DB_PASSWORD='p w'; export S3_KEY=k",
     f"export MY_SERVICE_SECRET={R}; export DB_PASSWORD='{R}'; export S3_KEY={R}"),
    # /proc/<pid>/environ and /proc/<pid>/cmdline: NUL-separated
    ("HOME=/root\0VLLM_API_KEY=k3\0PATH=/bin\0", f"HOME=/root\0VLLM_API_KEY={R}\0PATH=/bin\0"),
    # a diff of an env file
    ("--- before\n+++ after\n-VLLM_API_KEY=old\n+VLLM_API_KEY=new\n", f"--- before\n+++ after\n-VLLM_API_KEY={R}\n+VLLM_API_KEY={R}\n"),
    # YAML, JSON, Python reprs (vLLM logs its non-default args)
    ("model: m\napi-key: k1\nhf_token: 'hf1'\n", f"model: m\napi-key: {R}\nhf_token: '{R}'\n"),
    ('{"Env": ["VLLM_API_KEY=k3", "A=1"], "HF_TOKEN": "hf1"}', f'{{"Env": ["VLLM_API_KEY={R}", "A=1"], "HF_TOKEN": "{R}"}}'),
    ("non-default args: {'model': 'm', 'api_key': ['k1', 'k2']}", f"non-default args: {{'model': 'm', 'api_key': ['{R}', '{R}']}}"),
    # HTTP credentials, a URL's password
    ("GET /v1/models HTTP/1.0\r\nAuthorization: Bearer k1\r\n", f"GET /v1/models HTTP/1.0\r\nAuthorization: Bearer {R}\r\n"),
    ("curl -H 'Authorization: Bearer k1' http://h/v1", f"curl -H 'Authorization: Bearer {R}' http://h/v1"),
    ("ssh://root:pw1@10.0.0.1:22", f"ssh://root:{R}@10.0.0.1:22"),
])
def test_every_form_of_a_secret_is_redacted_in_a_text(text, shown):
    assert redact(text) == shown


@pytest.mark.parametrize("text", [
    "vllm serve m --port 8000 --max-model-len 4096 --ssl-keyfile /etc/k.pem",
    "Environment=CUDA_VISIBLE_DEVICES=GPU-1 HF_HOME=/var/lib/vllm/hf HF_TOKEN_PATH=/t",
    "max-num-batched-tokens: 8192\ntokenizer: /t\nserved-model-name: chat\n",
    "no --api-key (it shows in ps); put VLLM_API_KEY in an EnvironmentFile",
    "a dedicated user, not root (unset means root)",
    "sha256 3fa9c2d1e0b7 of VLLM_API_KEY=<redacted: 12 bytes from /keys/chat.key>",
    "",
])
def test_a_text_without_secrets_stays_as_it_was(text):
    assert redact(text) == text


def test_a_secret_written_with_escapes_does_not_survive():
    shown = redact('vllm serve m --api-key "k\\"1" --port 1')
    assert 'k\\"1' not in shown and "k\"1" not in shown and "--port 1" in shown


def test_secret_names():
    assert all(map(is_secret_name, ["VLLM_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "OPENAI_API_KEY",
                                    "AWS_SECRET", "DB_PASSWORD", "--api-key", "api_key", "hf-token", "token"]))
    assert not any(map(is_secret_name, ["CUDA_VISIBLE_DEVICES", "HF_HOME", "HF_TOKEN_PATH", "--ssl-keyfile",
                                        "--max-num-batched-tokens", "--tokenizer", "keyboard"]))


def test_environments_and_data():
    assert redact_environment({"VLLM_API_KEY": "k3", "A": "1", "B": "--api-key=k4"}) == {
        "VLLM_API_KEY": R, "A": "1", "B": f"--api-key={R}"}
    # a value the plan already redacted keeps what it says
    assert redact_environment({"VLLM_API_KEY": "<redacted: 12 bytes from /k>"}) == {"VLLM_API_KEY": "<redacted: 12 bytes from /k>"}
    data = {"argv": ["vllm", "serve", "--api-key", "k1", "k2"], "env": {"HF_TOKEN": "hf1"}, "n": 3,
            "log": "Authorization: Bearer k5"}
    assert redact_data(data) == {"argv": ["vllm", "serve", "--api-key", R, R], "env": {"HF_TOKEN": R}, "n": 3,
                                 "log": f"Authorization: Bearer {R}"}


SECRETS = ("sk-second-key", "sk-first-key", "sk-env-key", "sk-error")


def audit_report() -> HostReport:
    """What the suite records for a server started with `--api-key K1 K2` and VLLM_API_KEY (the issue's case)."""
    command = "/opt/vllm/venv/bin/vllm serve m --api-key sk-first-key sk-second-key --port 8000"
    return HostReport("h", "10.0.0.1", [
        CheckResult("h", "my-llm.service: ExecStart", "no --api-key (it shows in ps)", command, "failed"),
        CheckResult("h", "my-llm.service: Environment", "(reported)", "VLLM_API_KEY=sk-env-key", "passed"),
        CheckResult("h", "my-llm.service: ready", "ready", "", "error", "KeyError: HF_TOKEN=sk-error"),
    ])


def test_the_audit_reports_show_no_key(tmp_path):
    from rich.console import Console

    console = Console(record=True, width=400)
    console.print(host_table(audit_report(), every_check=True))
    write_json({"h": audit_report()}, tmp_path / "a.json")
    write_junit({"h": audit_report()}, tmp_path / "a.xml")
    outputs = {"table": console.export_text(), "json": (tmp_path / "a.json").read_text(),
               "junit": (tmp_path / "a.xml").read_text()}
    for name, text in outputs.items():
        for secret in SECRETS:
            assert secret not in text, (name, secret)
    checks = json.loads(outputs["json"])["hosts"]["h"]["checks"]
    assert checks[0]["actual"] == f"/opt/vllm/venv/bin/vllm serve m --api-key {R} {R} --port 8000"
    assert checks[0]["expected"] == "no --api-key (it shows in ps)"
    assert f"--api-key {R} {R} --port 8000" in outputs["table"]
    failure = ElementTree.fromstring(outputs["junit"]).find(".//failure")
    assert failure.get("message") == f"expected no --api-key (it shows in ps), actual {checks[0]['actual']}"


def test_a_bench_run_set_keeps_no_key(tmp_path):
    run = Run(1, 1, 7, {"completed": 1, "output_throughput": 1.0, "median_tpot_ms": 1.0,
                        "server_args": ["vllm", "serve", "m", "--api-key", "sk-first-key", "sk-second-key"]})
    RunSet("r", {"server_config": "model: m\napi-key: sk-env-key\n"}, [run]).save(tmp_path / "r")
    saved = "".join(path.read_text() for path in (tmp_path / "r").rglob("*.json"))
    assert "model: m" in saved and "median_tpot_ms" in saved
    for secret in SECRETS:
        assert secret not in saved
