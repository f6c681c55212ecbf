"""No secret appears in any output: plan, apply (--check --diff, first and second run), audit (spec and
profile mode: table, JSON, JUnit) and bench (its output and its result files), against one real test host.

Distinct secrets are planted everywhere one can be: the spec's api_key_file and three env secrets it
declares (HF_TOKEN from a file, DB_CONN, a name no rule finds secret, from the controller's environment, S3_CONN,
another, vault-encrypted in the spec as `ansible-vault encrypt_string` prints it) of the instance apply builds, and, on the same host, two vLLM servers we did not build, as
profile mode finds them: a unit started with `--api-key K1 "K2"` (vLLM takes one or more keys),
`Environment=VLLM_API_KEY=K3` and an EnvironmentFile with HF_TOKEN, and a unit running
`bash -c '… --api-key=K4'`. Every output is captured, and every file `provision inventory` writes, and searched for each secret (also with its
whitespace and table borders taken out: a wrapped cell must not hide one); each output must also show
the thing itself with `<redacted>` in the key's place, so the test cannot pass by printing nothing.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from provisioner.audit.runner import disconnect
from tests.integration.test_audit import lab_connection
from tests.lab.bench_client import ensure_bench_vllm, ensure_tokenizer
from tests.lab.specs import VLLM_BIN, host_entry, install_standin, instance_entry, write_spec

PROVISION = [sys.executable, "-m", "provisioner.cli.main"]
R = "<redacted>"
SECRETS = {
    "api_key_file": "sk-spec-keyfile-1111",
    "spec env HF_TOKEN": "hf-spec-env-2222",
    "spec env DB_CONN": "db-spec-controller-env-8888",
    "spec env S3_CONN (vault)": "s3-spec-vault-9999",
    "--api-key first": "sk-profile-first-3333",
    "--api-key second (quoted)": "sk-profile-second-4444",
    "Environment=VLLM_API_KEY": "sk-profile-env-5555",
    "bash -c --api-key=": "sk-profile-bash-6666",
    "EnvironmentFile HF_TOKEN": "hf-profile-envfile-7777",
}
DB_CONN_VARIABLE = "VP_LAB_SECRETS_DB_CONN"  # the controller's environment variable DB_CONN is declared from
VAULT_PASSWORD = "lab-vault-password-0"  # in a file ANSIBLE_VAULT_PASSWORD_FILE names (not a secret the outputs hide)
VAULT_PASSWORD_FILE = Path(tempfile.gettempdir()) / f"vp-lab-secrets-vault-{os.getpid()}"  # removed by `outputs`
MODEL = "facebook/opt-125m"
HAND_UNIT = f"""\
[Unit]
Description=LLM server someone set up by hand

[Service]
ExecStart={VLLM_BIN} serve {MODEL} --port 8001 --api-key {SECRETS['--api-key first']} "{SECRETS['--api-key second (quoted)']}"
Environment=VLLM_API_KEY={SECRETS['Environment=VLLM_API_KEY']}
EnvironmentFile=/etc/my-llm.env

[Install]
WantedBy=multi-user.target
"""
BASH_UNIT = f"""\
[Unit]
Description=Another one, through a shell

[Service]
ExecStart=/bin/bash -c 'exec {VLLM_BIN} serve {MODEL} --port 8002 --api-key={SECRETS['bash -c --api-key=']}'

[Install]
WantedBy=multi-user.target
"""


def run(*args, timeout: int = 900) -> subprocess.CompletedProcess:
    started = time.monotonic()
    result = subprocess.run([*PROVISION, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                            # one table row a line: the checks below read it; the vault password as
                            # ansible-playbook reads it (provision and the ansible-playbook it runs)
                            env={**os.environ, "COLUMNS": "320", DB_CONN_VARIABLE: SECRETS["spec env DB_CONN"],
                                 "ANSIBLE_VAULT_PASSWORD_FILE": str(VAULT_PASSWORD_FILE)})
    print(f"provision {args[0]}: {time.monotonic() - started:.1f} s")
    return result


@pytest.fixture(scope="module")
def outputs(lab, tmp_path_factory):
    """One host: the spec applied, the hand-made servers planted; every command run once, its output kept."""
    venv = ensure_bench_vllm()
    tokenizer = ensure_tokenizer(venv)
    host = lab.boot(f"se{lab.boot_count}", binds=(str(venv), str(tokenizer)))
    folder = tmp_path_factory.mktemp("secrets")
    key_file = folder / "chat.key"
    key_file.write_text(SECRETS["api_key_file"] + "\n")
    (folder / "hf_token").write_text(SECRETS["spec env HF_TOKEN"] + "\n")
    install_standin(host)
    env = {"HF_TOKEN": {"file": str(folder / "hf_token")}, "DB_CONN": {"env": DB_CONN_VARIABLE}}
    env["S3_CONN"] = VAULT_PLACEHOLDER
    spec = write_spec(folder / "spec.yml", [host_entry(host)], [instance_entry(
        host, "chat", 8000, share=0.9, api_key_file=str(key_file), env=env,
        options={"max-model-len": 4096, "max-num-seqs": 4, "tokenizer": str(tokenizer)})])
    paste_vault_string(spec, "S3_CONN", SECRETS["spec env S3_CONN (vault)"])
    captured: dict[str, subprocess.CompletedProcess] = {}
    files: dict[str, Path] = {}
    try:
        captured["plan"] = run("plan", "--spec", spec)
        captured["plan --json"] = run("plan", "--json", "--spec", spec)
        captured["inventory"] = run("inventory", "--spec", spec, "-o", folder / "inventory")
        files.update({f"inventory {path.relative_to(folder)}": path for path in sorted((folder / "inventory").rglob("*"))
                      if path.is_file()})
        captured["apply --check --diff"] = run("apply", "--spec", spec, "--check", "--diff")
        captured["apply"] = run("apply", "--spec", spec)
        captured["apply again"] = run("apply", "--spec", spec, "--diff")
        captured["host env file"] = host.ssh("stat -c '%a %U:%G' /etc/vllm/chat.env; "
                                             "tr '\\0' '\\n' < /proc/$(systemctl show vllm-chat -p MainPID --value)/environ"
                                             " | grep -E '^(HF_TOKEN|DB_CONN|S3_CONN)=' | sort", check=False)
        captured["host unit"] = host.ssh("cat /etc/systemd/system/vllm-chat.service", check=False)
        plant_servers(host, folder)
        files.update({"spec audit JSON": folder / "spec.json", "spec audit JUnit": folder / "spec.xml"})
        captured["spec audit"] = run("audit", "spec", "--spec", spec, "--all", "--json", files["spec audit JSON"],
                                     "--junit", files["spec audit JUnit"], timeout=300)
        files.update({"profile audit JSON": folder / "profile.json", "profile audit JUnit": folder / "profile.xml"})
        captured["profile audit"] = run("audit", "host", f"ssh://root@{host.address}", "--key", host.ssh_key,
                                        "--known-hosts", host.known_hosts, "--all", "--json", files["profile audit JSON"],
                                        "--junit", files["profile audit JUnit"], timeout=300)
        plant_exposed_dropin(host, folder)
        files["exposed audit JSON"] = folder / "exposed.json"
        captured["spec audit, a secret in a world-readable drop-in"] = run(
            "audit", "spec", "--spec", spec, "--all", "--json", files["exposed audit JSON"], timeout=300)
        results = folder / "bench-results"
        captured["bench"] = run("bench", "run", "chat", "--spec", spec, "--vllm", f"{venv}/bin/vllm", "--results", results,
                                "--load", "smoke", "--repeats", "1", "--no-floor", "--baseline", "b", timeout=1200)
        files.update({f"bench {path.relative_to(results / 'b')}": path for path in sorted(results.rglob("*"))
                      if path.is_file()})
        yield captured, {name: path.read_text(encoding="utf-8") for name, path in files.items()}
    finally:
        VAULT_PASSWORD_FILE.unlink(missing_ok=True)
        disconnect([lab_connection(host)])
        lab.destroy(host)


VAULT_PLACEHOLDER = "@@vault@@"


def paste_vault_string(spec: Path, name: str, value: str) -> None:
    """`NAME: !vault |` and the $ANSIBLE_VAULT block, as `ansible-vault encrypt_string --name NAME` prints it,
    pasted into the spec in the placeholder's place (indented under the key, as a user re-indents it)."""
    VAULT_PASSWORD_FILE.write_text(VAULT_PASSWORD + "\n")
    VAULT_PASSWORD_FILE.chmod(0o600)
    printed = subprocess.run([str(Path(sys.executable).with_name("ansible-vault")), "encrypt_string", "--name", name,
                              "--vault-password-file", str(VAULT_PASSWORD_FILE), value],
                             capture_output=True, text=True, check=True).stdout
    assert printed.startswith(f"{name}: !vault |\n") and value not in printed, printed
    text = spec.read_text()
    (line,) = [line for line in text.splitlines() if VAULT_PLACEHOLDER in line]
    indent = " " * (len(line) - len(line.lstrip()))
    block = "\n".join(f"{indent}  {part.strip()}" for part in printed.splitlines()[1:] if part.strip())
    spec.write_text(text.replace(line, f"{indent}{name}: !vault |\n{block}"))


def plant_servers(host, folder: Path) -> None:
    """The two servers we did not build (run by the venv apply installed), started and listening."""
    env_file = folder / "my-llm.env"
    env_file.write_text(f"HF_TOKEN={SECRETS['EnvironmentFile HF_TOKEN']}\n")
    host.put(env_file, "/etc/my-llm.env", mode="0600")
    for name, text in (("my-llm", HAND_UNIT), ("my-shell-llm", BASH_UNIT)):
        (folder / f"{name}.service").write_text(text)
        host.put(folder / f"{name}.service", f"/etc/systemd/system/{name}.service", mode="0644")
    host.ssh("systemctl daemon-reload && systemctl start my-llm.service my-shell-llm.service")
    host.ssh("for i in $(seq 300); do ss -Hltn | grep -q ':8001 ' && ss -Hltn | grep -q ':8002 ' && exit 0; sleep 0.1; done;"
             " exit 1")


EXPOSED_DROPIN = "/etc/systemd/system/vllm-chat.service.d/50-db.conf"


def plant_exposed_dropin(host, folder: Path) -> None:
    """A drop-in of the unit apply wrote, 0644, setting DB_CONN to the spec's declared value (by a name no rule
    finds secret): what someone does by hand to "fix" an environment."""
    (folder / "50-db.conf").write_text(f"[Service]\nEnvironment=DB_CONN={SECRETS['spec env DB_CONN']}\n")
    host.put(folder / "50-db.conf", EXPOSED_DROPIN, mode="0644")
    host.ssh("systemctl daemon-reload")


def squashed(text: str) -> str:
    """The text without whitespace and table borders: a secret wrapped over two lines of a cell joins up."""
    return re.sub(r"[\s│┃║|─━┆]+", "", text)


def test_no_output_holds_a_secret(outputs):
    captured, files = outputs
    on_host = ("host env file",)  # read from the host by the test itself, to see the secrets arrived
    texts = {f"{name} stdout": result.stdout for name, result in captured.items() if name not in on_host}
    texts |= {f"{name} stderr": result.stderr for name, result in captured.items() if name not in on_host}
    texts |= files
    assert any(name.startswith("inventory inventory/host_vars/") for name in files)
    assert {"bench runset.json", "bench summary.json", "bench runs/c1-r1.json"} <= set(files)
    leaks = [(where, what) for where, text in texts.items() for what, secret in SECRETS.items()
             if secret in text or secret in squashed(text)]
    assert not leaks, "\n".join(f"the secret of {what} in {where}" for where, what in leaks)


def test_plan_and_apply_show_what_they_do_with_the_keys_redacted(outputs):
    captured, _ = outputs
    for name in ("plan", "apply --check --diff", "apply", "apply again"):
        assert captured[name].returncode == 0, (name, captured[name].stdout + captured[name].stderr)
    plan = captured["plan"].stdout
    assert "Environment=HF_TOKEN" not in plan and "Environment=DB_CONN" not in plan  # the unit holds no secret
    assert re.search(r"VLLM_API_KEY=<redacted: 20 bytes from \S+chat.key>", plan)  # the env file
    assert re.search(r"HF_TOKEN=<redacted: 16 bytes from \S+hf_token>", plan)
    assert f"DB_CONN=<redacted: from the controller's ${DB_CONN_VARIABLE}>" in plan
    assert "S3_CONN=<redacted: vault-encrypted in the spec>" in plan
    # the diff of the unit file that would be written: every other line as it is
    check = captured["apply --check --diff"].stdout
    assert "+Environment=CUDA_DEVICE_ORDER=PCI_BUS_ID" in check and "HF_TOKEN" not in check.split("chat.env")[0]


def test_the_secrets_reach_the_server_through_the_0600_env_file_alone(outputs):
    """Role vllm_service read them on the controller (Ansible's file and env lookups, the vault-encrypted one
    decrypted by ansible-playbook with the password provision apply passed on) into the env file."""
    captured, _ = outputs
    assert captured["host env file"].stdout.splitlines() == [
        "600 root:root", f"DB_CONN={SECRETS['spec env DB_CONN']}", f"HF_TOKEN={SECRETS['spec env HF_TOKEN']}",
        f"S3_CONN={SECRETS['spec env S3_CONN (vault)']}"]
    for name in ("HF_TOKEN", "DB_CONN", "S3_CONN"):
        assert name not in captured["host unit"].stdout


def test_the_inventory_holds_where_the_secrets_come_from_for_its_owner_alone(outputs):
    captured, files = outputs
    assert captured["inventory"].returncode == 0, captured["inventory"].stderr
    (host_vars,) = [text for name, text in files.items() if name.startswith("inventory inventory/host_vars/")]
    assert "HF_TOKEN:\n        file: " in host_vars and f"DB_CONN:\n        env: {DB_CONN_VARIABLE}" in host_vars
    # the vault-encrypted one still encrypted, as Ansible reads it (the value itself: test_no_output_holds_a_secret)
    assert "S3_CONN:\n        vault: true\n" in host_vars
    assert "vllm_service_vault_secrets:\n  chat:\n    S3_CONN: !vault |\n      $ANSIBLE_VAULT;1.1;AES256\n" in host_vars


def test_the_audit_fails_a_world_readable_dropin_holding_a_declared_secret(outputs):
    captured, files = outputs
    result = captured["spec audit, a secret in a world-readable drop-in"]
    assert result.returncode == 1, result.stdout
    row = checks_of(files["exposed audit JSON"])["secrets readable by others"]
    assert (row["actual"], row["status"]) == (f"{EXPOSED_DROPIN} (0644) holds a secret", "failed")
    assert checks_of(files["spec audit JSON"])["secrets readable by others"]["status"] == "passed"


def checks_of(report: str) -> dict[str, dict]:
    (host,) = json.loads(report)["hosts"].values()
    return {check["check"]: check for check in host["checks"]}


def test_the_spec_audit_compares_the_env_file_with_the_secrets_by_hash(outputs):
    captured, files = outputs
    checks = checks_of(files["spec audit JSON"])
    # the two servers set up by hand are none of the spec's: spec mode fails them, and only them (keys unsaid)
    failed = {name: check["actual"] for name, check in checks.items() if check["status"] in ("failed", "error")}
    assert list(failed) == ["vLLM servers and GPU processes not in the spec"], captured["spec audit"].stdout
    assert re.fullmatch(r"stray vLLM server: pid \d+ on 0\.0\.0\.0:8001, started by systemd unit my-llm\.service,"
                        r" API key set, stray vLLM server: pid \d+ on 0\.0\.0\.0:8002, started by systemd unit"
                        r" my-shell-llm\.service, API key set", *failed.values())
    assert captured["spec audit"].returncode == 1, captured["spec audit"].stdout
    # the env file's hash: the key and both declared secrets, as the plan renders them with their real values
    assert checks["vllm-chat.service: EnvironmentFile content"]["status"] == "passed"
    assert checks["vllm-chat.service: EnvironmentFile mode"]["status"] == "passed"
    assert checks["vllm-chat.service: ready (one request served)"]["status"] == "passed"  # with the key


def test_the_profile_audit_shows_each_command_line_with_its_keys_redacted(outputs):
    captured, files = outputs
    assert captured["profile audit"].returncode == 1, captured["profile audit"].stdout  # drift: run as root…
    checks = checks_of(files["profile audit JSON"])
    assert set(checks["vLLM units"]["actual"].split(", ")) >= {"my-llm.service", "my-shell-llm.service"}
    hand = checks["my-llm.service: ExecStart"]
    assert hand["actual"] == f"{VLLM_BIN} serve {MODEL} --port 8001 --api-key {R} {R}"
    assert hand["status"] == "failed"  # the profile's rule: no --api-key on a command line
    shell = checks["my-shell-llm.service: ExecStart"]["actual"]
    assert shell.startswith("/bin/bash -c ") and shell.endswith(f"--port 8002 --api-key={R}"), shell
    # the probes used the keys (read on the host from the processes), and said nothing of them
    for unit, port in (("my-llm.service", 8001), ("my-shell-llm.service", 8002)):
        models = f"{unit}: GET http://127.0.0.1:{port}/v1/models"  # bound to every address: asked on the loopback
        own_key = f"{MODEL} (key: the api-key option on the command line of pid "
        assert checks[models]["actual"].startswith(own_key), checks[models]
    junit = ElementTree.fromstring(files["profile audit JUnit"])
    messages = [failure.get("message") for failure in junit.iter("failure")]
    assert f"actual {hand['actual']}" in " ".join(messages)
    assert f"--api-key {R} {R}" in captured["profile audit"].stdout


def test_bench_measured_with_the_key_and_kept_none(outputs):
    captured, files = outputs
    assert captured["bench"].returncode == 0, captured["bench"].stdout + captured["bench"].stderr
    run = json.loads(files["bench runs/c1-r1.json"])
    assert run["completed"] == run["num_prompts"] and run["failed"] == 0  # the instance requires its key
    assert "max-num-seqs: 4" in json.loads(files["bench runset.json"])["server_config"]
