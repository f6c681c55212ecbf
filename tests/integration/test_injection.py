"""Nasty spec values reach real systemd exactly, and add nothing (issue 13, part 2).

One bookworm host, no Ansible: the units and config files `build_plan` renders for instances whose model,
env values, string options and served-model-name carry spaces, quotes, $, %, backslashes, ;, unicode...
are installed as they are (each under its own name; they are never started), systemd reloads, and its
D-Bus properties (exact strings, not `systemctl show`'s display) must hold exactly the values, with no
directive added. The config files must read back (YAML, as vLLM reads them) to exactly the values.

The quadlet: the lab's podman host (trixie) is not built here, so podman's generator is not run. Its
HealthCmd= is proven with the host's real /bin/sh running the exact rendered command (podman runs a string
health command with `/bin/sh -c`), after what systemd does to the generated unit's ExecStart= line (%% and
$$ undone: quadlet copies the value there without escaping them); its ExecStartPost= (a [Service] line that
quadlet passes to systemd as it is) by real systemd, in a unit of its own.
"""

from __future__ import annotations

import io
import json
import shlex
import subprocess
import tarfile

import pytest
import yaml

from provisioner.plan import build_plan
from provisioner.spec import SpecError, validate_spec
from tests.injection_values import QUOTED
from tests.lab.specs import fake_gpu_uuid

WAIT_READY = "/usr/local/lib/vllm-provision/wait-ready"
# stands in for the readiness probe: prints the arguments it got, as JSON
ARGV_PRINTER = "#!/usr/bin/python3\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n"
# D-Bus properties of each unit: the exact strings systemd holds
READ_PROPERTIES = r"""
import json, subprocess, sys
def busctl(*args):
    return json.loads(subprocess.run(["busctl", "--json=short", *args], check=True, capture_output=True, text=True).stdout)
out = {}
for unit in sys.argv[1:]:
    path = busctl("call", "org.freedesktop.systemd1", "/org/freedesktop/systemd1",
                  "org.freedesktop.systemd1.Manager", "LoadUnit", "s", unit)["data"][0]
    prop = lambda interface, name: busctl("get-property", "org.freedesktop.systemd1", path,
                                          "org.freedesktop.systemd1." + interface, name)["data"]
    out[unit] = {
        "LoadState": prop("Unit", "LoadState"),
        "Description": prop("Unit", "Description"),
        "Environment": prop("Service", "Environment"),
        **{name: [command[1] for command in prop("Service", name)]
           for name in ("ExecStartPre", "ExecStart", "ExecStartPost", "ExecStop")},
    }
print(json.dumps(out))
"""


def spec_with_values(host) -> dict:
    """Per value: an instance with it as model, env value and string option (the model is its served
    name), and one with it as served-model-name; and a podman one with it as served-model-name and env."""
    instances = []
    for index, value in enumerate(QUOTED):
        common = {"host": host.name, "gpus": [0], "gpu_memory_utilization": 0.01}
        instances += [
            {**common, "name": f"m{index}", "port": 9000 + index, "model": value,
             "env": {"FOO": value}, "options": {"chat-template": value}},
            {**common, "name": f"s{index}", "port": 9100 + index, "model": "Qwen/Qwen3-1.7B",
             "options": {"served-model-name": value, "tokenizer": value}},
            {**common, "name": f"p{index}", "port": 9200 + index, "model": "Qwen/Qwen3-1.7B",
             "options": {"served-model-name": value}, "env": {"FOO": value}, "container": {"engine": "podman"}},
        ]
    hosts = [{"name": host.name, "address": host.address, "gpus": {"memory_share_limit": 1.0, "devices": [
        {"index": 0, "uuid": fake_gpu_uuid(host), "model": "NVIDIA GeForce RTX 3090"}]}}]
    # an instance a field's own rule refuses is left out (e.g. an option value starting with '-')
    kept = [entry for entry in instances if _valid({"version": 1, "hosts": hosts, "instances": [entry]})]
    assert len(kept) >= len(instances) - 3, [entry["name"] for entry in instances if entry not in kept]
    return {"version": 1, "hosts": hosts, "instances": kept}


def _valid(data: dict) -> bool:
    try:
        validate_spec(data, check_files=False)
    except SpecError:
        return False
    return True


def install_files(host, files: dict[str, str]) -> None:
    """Put the files on the host in one go (a tar stream over ssh)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for path, content in files.items():
            data = content.encode()
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size, info.mode = len(data), 0o644
            archive.addfile(info, io.BytesIO(data))
    result = subprocess.run(host.ssh_command("tar -x -C / -f -"), input=buffer.getvalue(), capture_output=True, timeout=60)
    assert result.returncode == 0, result.stderr


def setting(content: str, key: str) -> list[str]:
    return [line.removeprefix(f"{key}=") for line in content.splitlines() if line.startswith(f"{key}=")]


@pytest.fixture(scope="module")
def installed(lab):
    """One host with every rendered unit and config file in place, systemd reloaded; yields the plan,
    what systemd holds per unit, and the config files as read back from the host."""
    (host,) = lab.boot_many([f"inj{lab.boot_count}"])
    try:
        spec = validate_spec(spec_with_values(host), check_files=False)
        (plan,) = build_plan(spec)
        venv_units = [unit for unit in plan.units if not unit.instance.startswith("p")]
        # each unit's readiness probe (ExecStartPost=; the quadlet's passes to systemd as it is) run by
        # systemd as the ExecStart= of a unit of its own: systemd expands $$ and ${...} only when it runs
        # a command line, and the stand-in probe prints the arguments it got
        probes = {unit.instance: setting(unit.unit.content, "ExecStartPost")[0] for unit in plan.units}
        files = {unit.unit.path: unit.unit.content for unit in venv_units}
        files |= {unit.config_file.path: unit.config_file.content for unit in plan.units}
        files |= {f"/etc/systemd/system/probe-{name}.service":
                  f"[Service]\nType=oneshot\nStandardOutput=file:/run/probe-{name}.json\nExecStart={line}\n"
                  for name, line in probes.items()}
        files["/root/read-properties.py"] = READ_PROPERTIES
        files[WAIT_READY] = ARGV_PRINTER
        install_files(host, files)
        host.ssh(f"chmod 0755 {WAIT_READY} && systemctl daemon-reload")
        # a unit systemd refuses runs no probe: the test on the probes says which
        host.ssh(f"systemctl start {' '.join(f'probe-{name}.service' for name in probes)}", check=False)
        units = [f"vllm-{unit.instance}.service" for unit in venv_units]
        systemd = json.loads(host.ssh(f"python3 /root/read-properties.py {' '.join(units)}").stdout)
        read_back = ("python3 -c 'import json, pathlib, sys; print(json.dumps({str(p): p.read_text() "
                     "for p in pathlib.Path(sys.argv[1]).glob(sys.argv[2])}))'")
        configs = json.loads(host.ssh(f"{read_back} /etc/vllm '*.yaml'").stdout)
        probed = {path.removeprefix("/run/probe-").removesuffix(".json"): json.loads(text)
                  for path, text in json.loads(host.ssh(f"{read_back} /run 'probe-*.json'").stdout).items()}
        yield host, spec, plan, systemd, configs, probed
    finally:
        lab.destroy(host)


def _value(name: str) -> str:
    return QUOTED[int(name[1:])]


def test_systemd_holds_exactly_the_description_environment_and_command_lines(installed):
    _, spec, plan, systemd, _, _ = installed
    ports = {instance.name: instance.port for instance in spec.instances}
    checked = 0
    for unit in plan.units:
        if unit.instance.startswith("p"):
            continue
        held = systemd[f"vllm-{unit.instance}.service"]
        value = _value(unit.instance)
        assert held["LoadState"] == "loaded", (unit.instance, held)
        # nothing added: one ExecStart=, one ExecStartPost=, no ExecStartPre= or ExecStop=
        assert held["ExecStartPre"] == [] and held["ExecStop"] == [], held
        (start,) = held["ExecStart"]
        assert start == ["/opt/vllm/venvs/0.25.0/bin/vllm", "serve", "--config", f"/etc/vllm/{unit.instance}.yaml"]
        assert len(held["ExecStartPost"]) == 1, held
        model = value if unit.instance.startswith("m") else "Qwen/Qwen3-1.7B"
        assert held["Description"] == f"vLLM {unit.instance}: {model} on port {ports[unit.instance]}"
        expected = {key: value for key, value in unit.environment.items() if key != "VLLM_API_KEY"}
        assert dict(entry.split("=", 1) for entry in held["Environment"]) == expected
        if unit.instance.startswith("m"):
            assert expected["FOO"] == value
        checked += 1
    assert checked >= 2 * len(QUOTED) - 2


def test_the_config_files_read_back_exactly(installed):
    _, _, plan, _, configs, _ = installed
    assert len(configs) == len(plan.units)
    for unit in plan.units:
        config = yaml.safe_load(configs[unit.config_file.path])
        value = _value(unit.instance)
        if unit.instance.startswith("m"):
            assert (config["model"], config["chat-template"]) == (value, value)
        else:
            assert config["served-model-name"] == value
        if unit.instance.startswith("s"):
            assert config["tokenizer"] == value


def test_the_readiness_probe_run_by_systemd_gets_exactly_the_served_name(installed):
    """The units' ExecStartPost= and the quadlet's (which quadlet passes to systemd as it is)."""
    _, _, plan, _, _, probed = installed
    assert sorted(probed) == sorted(unit.instance for unit in plan.units)
    for unit in plan.units:
        argv = probed[unit.instance]
        assert argv[argv.index("--model"):] == ["--model", _value(unit.instance), "--timeout", "1740", "--warm-up",
                                                 "--pid="], argv


def test_the_quadlet_health_command_gets_exactly_the_served_name_from_sh(installed):
    host, _, plan, _, _, _ = installed
    for unit in plan.units:
        if not unit.instance.startswith("p"):
            continue
        (health,) = setting(unit.unit.content, "HealthCmd")
        as_podman_gets_it = health.replace("%%", "%").replace("$$", "$")  # systemd's reading of ExecStart=
        argv = json.loads(host.ssh(f"/bin/sh -c {shlex.quote(as_podman_gets_it)}").stdout)
        assert argv[argv.index("--model"):] == ["--model", _value(unit.instance), "--timeout", "20", "--once"]
    assert host.ssh("test -e /tmp/pwned", check=False).returncode == 1  # $(touch /tmp/pwned) never ran
