"""One rule per kind of value (plugins/module_utils/value_rules.py), against hostile values and, where one is
installed, against the parser of the program that reads the value (promtool, systemd-analyze)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from provisioner.base.module_utils import value_rules
from provisioner.base.paths import ROLES_DIR, collections_dir
from provisioner.base.secrets import read_api_key
from provisioner.fleet import monitoring
from provisioner.spec import SpecError, validate_spec
from provisioner.tune.slo import SloError, parse_slo
from provisioner.vllm.flags import load_catalog, read_value, supported_versions, value_problem
from tests.unit.conftest import UUID1, host, instance, problems_of, spec_data

HOSTILE_NUMBERS = ["9" * 40, "9" * 400, "١٦", "16\n", " 16", "-16", "0", "", "inf", "nan", "1e3", "16.5", "0x10"]


# --------------------------------------------------------------------------- sizes


@pytest.mark.parametrize("value", ["1K", "512M", "16G", "2T", "1024T"])
def test_a_size_is_a_whole_number_and_a_binary_unit(value):
    assert value_rules.size_problem(value) is None


@pytest.mark.parametrize("value", [*[number + "G" for number in HOSTILE_NUMBERS], "16", "16g", "16GB", "16GiB",
                                   "1025T", 16, None, True])
def test_a_size_refuses_what_mount_and_the_engines_would_misread(value):
    assert value_rules.size_problem(value)


def test_a_size_in_bytes():
    assert value_rules.size_bytes("16G") == 16 << 30
    with pytest.raises(ValueError, match="is not a size"):
        value_rules.size_bytes("16g")


# --------------------------------------------------------------------------- durations

ACCEPTED_DURATIONS = ["15s", "1m30s", "500ms", "1h", "1d", "2w", "1y", "1h30m15s500ms", "01m"]
REFUSED_DURATIONS = [*[number + "s" for number in HOSTILE_NUMBERS], "1h1d", "15 s", "15s ", "1M", "1min", "1.5h",
                     "0s", "0", "366d", "53w", "", "s", 15, None]


@pytest.mark.parametrize("value", ACCEPTED_DURATIONS)
def test_a_duration_in_prometheus_grammar(value):
    assert value_rules.duration_problem(value) is None


@pytest.mark.parametrize("value", REFUSED_DURATIONS)
def test_a_duration_refuses_what_prometheus_refuses_and_what_is_out_of_range(value):
    assert value_rules.duration_problem(value)


def test_a_duration_in_milliseconds():
    assert value_rules.duration_ms("1m30s") == 90_000
    assert value_rules.duration_ms("1y") == value_rules.MAX_DURATION_MS


@pytest.mark.skipif(not shutil.which("promtool"), reason="promtool (Debian's prometheus) is not installed")
def test_every_duration_the_rule_accepts_promtool_accepts_and_the_hostile_ones_it_refuses(tmp_path):
    def promtool_accepts(value: str) -> bool:
        config = tmp_path / "prometheus.yml"
        config.write_text(f'global:\n  scrape_interval: "{value}"\n  evaluation_interval: "{value}"\n')
        return subprocess.run(["promtool", "check", "config", str(config)], capture_output=True).returncode == 0

    assert all(promtool_accepts(value) for value in ACCEPTED_DURATIONS)
    refused_by_grammar = ["9" * 40 + "s", "١٦s", "1h1d", "15 s", "1M", "1min", "1.5h", "-16s", "0x10s"]
    assert not any(promtool_accepts(value) for value in refused_by_grammar)


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze is not installed")
def test_every_duration_the_rule_accepts_systemd_reads_for_the_gpu_timer_as_the_same_time():
    for value in [value for value in ACCEPTED_DURATIONS if "y" not in value]:  # systemd's year is 365.25 days
        shown = subprocess.run(["systemd-analyze", "timespan", value], capture_output=True, text=True, check=True)
        microseconds = int(next(line for line in shown.stdout.splitlines() if "μs:" in line).split(":")[1])
        assert microseconds == value_rules.duration_ms(value) * 1000, value


def test_the_spec_takes_prometheus_s_own_form_and_refuses_a_40_digit_interval():
    data = spec_data(instances=[])
    assert validate_spec({**data, "monitoring": {"scrape_interval": "1m30s"}}).monitoring.scrape_interval == "1m30s"
    (problem,) = problems_of({**data, "monitoring": {"scrape_interval": "9" * 40 + "s"}})
    assert problem.startswith("monitoring.scrape_interval: '" + "9" * 40 + "s' is longer than a year — ")


@pytest.mark.parametrize("version", supported_versions())
def test_a_size_and_a_port_the_rules_take_are_what_vllm_s_own_parser_reads_them_as(version):
    """As the pinned vLLM's parser reads a flag's value (its catalog, recorded from the real parser): a size
    in bytes as the size rule counts them (K, M, G, T: ×1024ⁿ, human_readable_int's binary units), a port as
    itself."""
    catalog = load_catalog(version)
    sized = catalog.option("kv-cache-memory-bytes")
    assert sized.kind == "human_int"
    for size in ["1K", "512M", "16G", "2T", "1024T"]:
        assert value_rules.size_problem(size) is None
        assert value_problem(catalog, sized, size) is None
        assert read_value(sized, size) == value_rules.size_bytes(size), size
    port = catalog.option("port")
    for number in [1, 8000, 65535]:
        assert value_rules.port_problem(number) is None
        assert value_problem(catalog, port, number) is None and read_value(port, str(number)) == number


# --------------------------------------------------------------------------- ports and addresses


@pytest.mark.parametrize("value", [0, -1, 65536, 10**40, True, "8000", 8000.0, None])
def test_a_port_is_a_whole_number_from_1_to_65535(value):
    assert value_rules.port_problem(value)
    assert value_rules.port_problem(8000) is None


@pytest.mark.parametrize("value", ["192.0.2.20", "2001:db8::11", "::", "gpu-1.example.org", "localhost"])
def test_an_address(value):
    assert value_rules.address_problem(value) is None


@pytest.mark.parametrize("value", ["fe80::1%eth0", "2001:db8::11%1", "[2001:db8::11]", "2001:db8::11:9100:x",
                                   "gpü.example", "a" * 64 + ".example", "x" * 254, "host name", "host\n", "", 1])
def test_an_address_refuses_zone_ids_brackets_and_what_dns_cannot_name(value):
    assert value_rules.address_problem(value)


def test_the_spec_refuses_a_zone_id_naming_the_fix():
    (problem,) = problems_of(spec_data(hosts=[host(address="fe80::1%eth0")]))
    assert problem.startswith("hosts[0].address: 'fe80::1%eth0' has a zone id (%…)")


def test_host_port_brackets_ipv6():
    assert value_rules.host_port("2001:db8::11", 9100) == "[2001:db8::11]:9100"
    assert value_rules.host_port("192.0.2.20", 9100) == "192.0.2.20:9100"
    assert value_rules.host_port("gpu1", 9100) == "gpu1:9100"


def test_every_scrape_target_of_an_ipv6_host_is_bracketed():
    data = spec_data(hosts=[host(address="2001:db8::11")], instances=[instance("chat", 8000, bind="::")])
    spec = validate_spec({**data, "monitoring": {"gpu_metrics": "dcgm"}})
    assert sorted(target.address for target in monitoring.targets(spec)) == [
        "[2001:db8::11]:8000", "[2001:db8::11]:9100", "[2001:db8::11]:9400"]


def _ipv6_gateway_spec(tmp_path):
    """A gateway on an IPv6 host (listening on ::) over a replica on an IPv4 host and one on an IPv6 host."""
    other_gpu = {"devices": [{"index": 0, "uuid": UUID1, "model": "NVIDIA GeForce RTX 4070"}]}
    hosts = [host("gpu-a", "192.0.2.21"), host("gpu-b", "2001:db8::22", gpus=other_gpu),
             {"name": "edge", "address": "2001:db8::30"}]
    instances = [instance("qwen-a", 8000, on="gpu-a", bind="0.0.0.0"), instance("qwen-b", 8001, on="gpu-b", bind="::")]
    data = {"version": 1, "hosts": hosts, "instances": instances,
            "gateways": [{"name": "public", "host": "edge", "bind": "::"}], "monitoring": {"gpu_metrics": "dcgm"}}
    return validate_spec(data, base_dir=tmp_path)


def test_the_gateway_writes_every_host_port_through_the_rule_as_ansible_renders_it(tmp_path):
    from provisioner.plan import build_plan
    from provisioner.validation.roles import host_variables
    from tests.unit.test_plan_matches_ansible import ansible_render

    spec = _ipv6_gateway_spec(tmp_path)
    (plan,) = build_plan(spec, ["edge"])
    rendered = ansible_render(ROLES_DIR / "gateway/templates/haproxy.cfg.j2",
                              {**host_variables(spec.host("edge"), [], spec), "gateway_api_keys": {}})
    assert rendered == plan.gateway_file.content  # the collection's filter in Ansible, the same rule in plan
    lines = [line.strip() for line in rendered.splitlines()]
    assert [line for line in lines if line.startswith(("bind ", "server "))] == [
        "bind " + value_rules.host_port("::", 8080),
        "server qwen-a " + value_rules.host_port("192.0.2.21", 8000),
        "server qwen-b " + value_rules.host_port("2001:db8::22", 8001)]
    assert "server qwen-b [2001:db8::22]:8001" in lines and "server qwen-a 192.0.2.21:8000" in lines
    assert [(route.url, route.replicas) for route in plan.routes] == [
        ("http://[2001:db8::30]:8080/v1", ["qwen-a 192.0.2.21:8000", "qwen-b [2001:db8::22]:8001"])]


@pytest.mark.skipif(not shutil.which("haproxy"), reason="haproxy (Debian's package) is not installed")
def test_haproxy_reads_the_gateway_config_of_an_ipv6_and_an_ipv4_replica(tmp_path):
    from provisioner.plan import build_plan

    (plan,) = build_plan(_ipv6_gateway_spec(tmp_path), ["edge"])
    config = tmp_path / "haproxy.cfg"
    config.write_text(plan.gateway_file.content)
    checked = subprocess.run(["haproxy", "-c", "-f", str(config)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # the check can fail: a server written address and port without a colon is refused
    config.write_text(plan.gateway_file.content.replace("[2001:db8::22]:8001", "[2001:db8::22]8001"))
    assert subprocess.run(["haproxy", "-c", "-f", str(config)], capture_output=True, timeout=60).returncode != 0


@pytest.mark.skipif(not shutil.which("promtool"), reason="promtool (Debian's prometheus) is not installed")
def test_prometheus_reads_each_ipv6_target_as_its_address_and_port(tmp_path):
    from urllib.parse import urlsplit

    spec = _ipv6_gateway_spec(tmp_path)
    monitoring.export(spec, tmp_path / "prometheus")
    config = tmp_path / "prometheus" / "prometheus.yml"
    checked = subprocess.run(["promtool", "check", "config", str(config)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    expected = {target.address for target in monitoring.targets(spec)}
    # each job's targets as Prometheus labels them after its discovery (promtool waits --timeout for more)
    jobs = [scrape["job_name"] for scrape in yaml.safe_load(config.read_text())["scrape_configs"]]
    shown = [subprocess.Popen(["promtool", "check", "service-discovery", "--timeout=5s", "prometheus.yml", job],
                              cwd=config.parent, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) for job in jobs]
    found = {target["labels"]["__address__"]
             for process in shown for target in json.loads(process.communicate(timeout=60)[0])}
    assert found == expected and "[2001:db8::22]:9400" in found
    # what the scraper dials: scheme://__address__/metrics, read back to the spec's address and port
    hosts = {host.name: host.address for host in spec.hosts}
    for target in monitoring.targets(spec):
        url = urlsplit(f"http://{target.address}/metrics")
        assert (url.hostname, url.port) == (hosts[target.labels["host"]], int(target.address.rsplit(":", 1)[1]))


# --------------------------------------------------------------------------- names


@pytest.mark.parametrize("value", ["Qwen", "qwen_7b", "-qwen", "qwen\n", "ｑwen", "", 7])
def test_a_name(value):
    assert value_rules.name_problem(value)
    assert value_rules.name_problem("qwen-7b") is None


@pytest.mark.parametrize("value", ["GPU-1234", "GPU-1B2C3D4E-5F60-4718-8A9B-0C1D2E3F4A5B",
                                   "GPU-1b2c3d4e-5f60-4718-8a9b-0c1d2e3f4a5b\n", "MIG-1"])
def test_a_gpu_uuid(value):
    assert value_rules.gpu_uuid_problem(value)
    assert value_rules.gpu_uuid_problem("GPU-1b2c3d4e-5f60-4718-8a9b-0c1d2e3f4a5b") is None


# --------------------------------------------------------------------------- versions


def test_a_driver_version_as_nvidia_smi_prints_it_and_of_its_branch():
    assert [version for version in DRIVER_VERSIONS if value_rules.driver_version_problem(version) is None] == [
        "580.95.05", "580.95", "575.51.03", "5800.1.1"]
    assert value_rules.driver_version_problem("575.51.03", "580") == \
        "575.51.03 is not of branch 580 — give a version of that branch (580.x)"
    assert value_rules.driver_version_problem("580.95.05", "580") is None
    assert value_rules.driver_version_problem("5800.95.05", "580")
    assert value_rules.driver_version_problem(580.95)


@pytest.mark.parametrize("value", ["58", "0580", "10000", "580.95", "r580", "580\n", "٥٨٠", 580, None])
def test_a_driver_branch(value):
    assert value_rules.driver_branch_problem(value)
    assert value_rules.driver_branch_problem("580") is None and value_rules.driver_branch_problem("1000") is None


def test_a_toolkit_version_as_apt_shows_it():
    assert [version for version in TOOLKIT_VERSIONS if value_rules.toolkit_version_problem(version) is None] == [
        "1.18.0-1", "1.18.0~rc.1-1"]


def test_a_vllm_version_as_pip_writes_it():
    assert [version for version in VLLM_VERSIONS if value_rules.vllm_version_problem(version) is None] == [
        "0.25.0", "0.25.0+cu129", "0.33.0rc1", "0.25.0.post1", "0.25"]
    assert value_rules.vllm_version_problem("9" * 65)  # bounded


def test_every_vllm_version_with_a_catalog_and_each_package_version_is_one_pip_takes():
    from packaging.version import InvalidVersion, Version

    from provisioner.vllm.builds import builds_of

    package_versions = [f"{version}+{build.variant}" for version in supported_versions()
                        for build in builds_of(version) if not build.default]
    for version in [*supported_versions(), *package_versions]:
        assert value_rules.vllm_version_problem(version) is None, version
        assert str(Version(version)) == version  # pip reads it as written
    for version in [version for version in VLLM_VERSIONS if value_rules.vllm_version_problem(version) is None]:
        assert str(Version(version)) == version  # never one pip refuses or rewrites
    with pytest.raises(InvalidVersion):
        Version("0.25.0-x/y")


def test_the_spec_uses_the_same_version_rules():
    data = spec_data()
    data["hosts"][0]["driver"] = {"source": "nvidia", "branch": "580", "version": "580.95.05\n"}
    data["hosts"][0]["container_toolkit"] = {"version": "1.18.0~rc1-1"}
    data["hosts"][0]["vllm"] = {"version": "0.25.0-x"}
    assert problems_of(data) == [
        "hosts[0].vllm.version: " + value_rules.vllm_version_problem("0.25.0-x"),
        "hosts[0].driver.version: " + value_rules.driver_version_problem("580.95.05\n"),
        "hosts[0].container_toolkit.version: " + value_rules.toolkit_version_problem("1.18.0~rc1-1")]


# --------------------------------------------------------------------------- files


def test_a_file_the_spec_names_is_a_small_regular_readable_one(tmp_path):
    key = tmp_path / "chat.key"
    key.write_text("sk-1\n")
    assert value_rules.file_problem(str(key), "the key") is None
    fifo = tmp_path / "fifo.key"
    os.mkfifo(fifo)
    (tmp_path / "empty.key").touch()
    problems = {
        "missing": value_rules.file_problem(str(tmp_path / "none.key"), "the key"),
        "folder": value_rules.file_problem(str(tmp_path), "the key"),
        "fifo": value_rules.file_problem(str(fifo), "the key"),
        "device": value_rules.file_problem("/dev/zero", "the key"),
        "empty": value_rules.file_problem(str(tmp_path / "empty.key"), "the key"),
    }
    big = tmp_path / "big.key"
    big.write_bytes(b"k" * (value_rules.MAX_SMALL_FILE_BYTES + 1))
    problems["big"] = value_rules.file_problem(str(big), "the key")
    assert problems == {
        "missing": f"{tmp_path}/none.key does not exist — create it with the key or correct the path",
        "folder": f"{tmp_path} is a folder, not a file — name the file that holds the key",
        "fifo": f"{fifo} is not a regular file (a device, a FIFO or a socket) — name a plain file that holds the key",
        "device": "/dev/zero is not a regular file (a device, a FIFO or a socket) — name a plain file that holds the key",
        "empty": f"{tmp_path}/empty.key is empty — put the key in it",
        "big": f"{big} is 65537 bytes, more than the key takes (at most 65536) — name the right file",
    }
    assert value_rules.file_problem(str(big), "the image", max_bytes=None) is None
    assert value_rules.file_problem(str(tmp_path / "empty.key"), "hosts", may_be_empty=True) is None


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every file")
def test_an_unreadable_file_is_named(tmp_path):
    key = tmp_path / "chat.key"
    key.write_text("sk-1\n")
    key.chmod(0)
    assert "is not readable by this user" in value_rules.file_problem(str(key), "the key")


def _returns_within(seconds: float, call) -> object:
    result: list = []
    thread = threading.Thread(target=lambda: result.append(_outcome(call)), daemon=True)
    thread.start()
    thread.join(seconds)
    assert result, f"still blocked after {seconds} s"
    return result[0]


def _outcome(call):
    try:
        return call()
    except Exception as error:  # noqa: BLE001 - the test looks at which
        return error


def test_reading_a_key_never_hangs_on_a_fifo_nor_reads_dev_zero_without_end(tmp_path):
    fifo = tmp_path / "fifo.key"
    os.mkfifo(fifo)
    assert isinstance(_returns_within(5, lambda: read_api_key(fifo)), OSError)
    assert isinstance(_returns_within(5, lambda: read_api_key("/dev/zero")), OSError)
    assert isinstance(_returns_within(5, lambda: read_api_key(tmp_path)), OSError)
    big = tmp_path / "big.key"
    big.write_bytes(b"k" * (10 << 20))
    assert "larger than 65536 bytes" in str(_returns_within(5, lambda: read_api_key(big)))
    key = tmp_path / "chat.key"
    key.write_text("sk-1 \n")
    assert read_api_key(key) == "sk-1"


@pytest.mark.parametrize("target", ["fifo", "/dev/zero", "folder"])
def test_the_spec_refuses_a_key_file_that_is_not_a_regular_file_naming_the_field(tmp_path, target):
    path = {"fifo": tmp_path / "fifo.key", "/dev/zero": "/dev/zero", "folder": tmp_path}[target]
    if target == "fifo":
        os.mkfifo(path)
    data = spec_data(instances=[instance("chat", 8000, api_key_file=str(path))])
    data["gateways"] = [{"name": "api", "host": "ws4070", "port": 8080}]  # its checks read the keys too
    caught = _returns_within(20, lambda: validate_spec(data, base_dir=tmp_path))
    assert isinstance(caught, SpecError)
    assert [str(problem) for problem in caught.problems if "api_key_file" in str(problem)] == [
        f"instances[0].api_key_file: {path} is "
        + ("a folder, not a file — name the file that holds" if target == "folder" else
           "not a regular file (a device, a FIFO or a socket) — name a plain file that holds")
        + " the API key (its content becomes VLLM_API_KEY)"]


# --------------------------------------------------------------------------- SLO limits


@pytest.mark.parametrize("value", [0, -1, float("inf"), float("nan"), float("9" * 400),
                                   3_600_001, True, "200", None])
def test_a_latency_limit_is_finite_positive_and_at_most_an_hour(value):
    assert value_rules.latency_limit_problem(value)
    assert value_rules.latency_limit_problem(200) is None


@pytest.mark.parametrize("value", [0, -5, 100.5, float("inf"), float("nan"), True])
def test_a_share_is_a_percentage(value):
    assert value_rules.share_limit_problem(value)
    assert value_rules.share_limit_problem(95) is None


# --------------------------------------------------------------------------- the roles' preflights: the same rules


def _preflight_results(tmp_path, role: str, variable: str, values: list, fixed: dict, name: str | None = None
                       ) -> list[bool]:
    """Run role `role`'s preflight task `name` (its first without; real Ansible on localhost) once per value of
    `variable`; whether it passed, per value."""
    tasks = yaml.safe_load((ROLES_DIR / role / "tasks/preflight.yml").read_text())
    task = next(task for task in tasks if name in (None, task.get("name")))
    task = {key: value for key, value in task.items() if key not in ("loop_control", "when")}
    task = {**task, "ignore_errors": True, "register": "checked", "loop": "{{ values }}",
            "vars": {**task.get("vars", {}), variable: "{{ item }}"}}
    playbook = [{"hosts": "localhost", "gather_facts": False, "vars": {"values": values, **fixed}, "tasks": [
        task, {"ansible.builtin.copy": {"dest": str(tmp_path / "results.json"), "mode": "0600",
                                        "content": "{{ checked.results | map(attribute='failed') | list | to_json }}"}}]}]
    (tmp_path / "playbook.yml").write_text(json.dumps(playbook))
    run = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                          "-e", f"ansible_python_interpreter={sys.executable}", str(tmp_path / "playbook.yml")],
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(collections_dir(tmp_path / "collections"))})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return [not failed for failed in json.loads((tmp_path / "results.json").read_text())]


def test_the_shm_and_node_exporter_preflights_take_exactly_what_the_spec_takes(tmp_path):
    sizes = ["16G", "512M", "1024T", "16g", "17179869184", "0G", "9" * 40 + "G", "١٦G", "1025T"]
    assert _preflight_results(tmp_path, "shm", "shm_size", sizes, {}) == [
        value_rules.size_problem(size) is None for size in sizes]
    durations = ["15s", "1m30s", "1y", "9" * 40 + "s", "0s", "1h1d", "15 s", "1M"]
    fixed = {"node_exporter_port": 9100, "node_exporter_dcgm_port": 9400}
    assert _preflight_results(tmp_path, "node_exporter", "node_exporter_gpu_interval", durations, fixed) == [
        value_rules.duration_problem(duration) is None for duration in durations]


def test_the_gateway_preflight_takes_exactly_the_replica_addresses_the_spec_takes(tmp_path):
    addresses = ["192.0.2.21", "2001:db8::22", "gpu-b.example.org", "[2001:db8::22]", "fe80::1%eth0", "gpu b", "::"]
    frontends = [[{"name": "public", "bind": "::", "port": 8080, "tls_certificate": None, "routes": [
        {"model": "m", "backend": "public-0", "api_key_file": None,
         "servers": [{"name": "qwen-a", "address": address, "port": 8000}]}]}] for address in addresses]
    role_vars = yaml.safe_load((ROLES_DIR / "gateway/vars/main.yml").read_text())
    fixed = {name: role_vars[name] for name in ("_gateway_routes", "_gateway_servers")}
    assert _preflight_results(tmp_path, "gateway", "gateway_frontends", frontends, fixed) == [
        value_rules.address_problem(address) is None for address in addresses]


DRIVER_VERSIONS = ["580.95.05", "580.95", "575.51.03", "580", "580.95.05\n", "r580.95", "5800.1.1", "580..1",
                   "580.95.05.1", "５80.95.05", "580.95.05 ", "0580.95"]


def test_the_driver_preflight_takes_exactly_the_versions_and_branches_the_spec_takes(tmp_path):
    fixed = {"nvidia_driver_branch": "580", "nvidia_driver_minimum_branch": None}
    assert _preflight_results(tmp_path, "nvidia_driver", "nvidia_driver_version", DRIVER_VERSIONS, fixed,
                              "Check the settings") == [
        value_rules.driver_version_problem(version, "580") is None for version in DRIVER_VERSIONS]
    branches = ["580", "535", "1000", "58", "0580", "580.95", "r580", "58O", "٥٨٠", 580]
    assert _preflight_results(tmp_path, "nvidia_driver", "nvidia_driver_branch", branches,
                              {"nvidia_driver_version": None, "nvidia_driver_minimum_branch": None},
                              "Check the settings") == [
        value_rules.driver_branch_problem(str(branch)) is None for branch in branches]


TOOLKIT_VERSIONS = ["1.18.0-1", "1.18.0~rc.1-1", "1.18.0", "1.18-1", "v1.18.0-1", "1.18.0-1\n", "1.18.0~rc1-1"]


def test_the_container_engine_preflight_takes_exactly_the_toolkit_versions_the_spec_takes(tmp_path):
    fixed = {"container_engine_nvidia_toolkit_manage": True}
    assert _preflight_results(tmp_path, "container_engine", "container_engine_nvidia_toolkit_version",
                              TOOLKIT_VERSIONS, fixed, "Check the toolkit's version") == [
        value_rules.toolkit_version_problem(version) is None for version in TOOLKIT_VERSIONS]


VLLM_VERSIONS = ["0.25.0", "0.25.0+cu129", "0.33.0rc1", "0.25.0.post1", "0.25.0-x", "v0.25.0", "0.25.0+CU129",
                 "0.25.0\n", "0.25", "latest", ""]


def test_the_vllm_install_preflight_takes_exactly_the_versions_the_spec_takes(tmp_path):
    assert _preflight_results(tmp_path, "vllm_install", "vllm_install_version", VLLM_VERSIONS, {}) == [
        value_rules.vllm_version_problem(version) is None for version in VLLM_VERSIONS]


def _vllm_service_check(tmp_path, entries: list[dict]) -> list[bool]:
    """Role vllm_service's check of each instance, per entry of vllm_service_instances (its vars: the role's)."""
    role_vars = yaml.safe_load((ROLES_DIR / "vllm_service/vars/main.yml").read_text())
    return _preflight_results(tmp_path, "vllm_service", "vllm_service_instance", entries,
                              {name: role_vars[name] for name in ("_vllm_service_owned_options",
                                                                  "_vllm_service_managed_env")},
                              "Check each instance")


def _service_entry(**fields) -> dict:
    return {"name": "chat", "model": "m", "host": "127.0.0.1", "port": 8000, "gpu_uuids": [UUID1],
            "gpu_memory_utilization": 0.5, "options": {}, "env": {}, "api_key_file": None, **fields}


def test_the_vllm_service_preflight_takes_exactly_the_gpu_uuids_and_hosts_the_spec_takes(tmp_path):
    uuids = [UUID1, UUID1.upper().replace("GPU", "GPU", 1), "GPU-1111", "MIG-" + UUID1[4:], UUID1 + "\n"]
    hosts = ["127.0.0.1", "::", "2001:db8::11", "[::]", "fe80::1%eth0", "gpu-1.example.org", "a b"]
    entries = [_service_entry(gpu_uuids=[uuid]) for uuid in uuids] + [_service_entry(host=host) for host in hosts]
    assert _vllm_service_check(tmp_path, entries) == [
        *[value_rules.gpu_uuid_problem(uuid) is None for uuid in uuids],
        *[value_rules.address_problem(host) is None for host in hosts]]


def test_the_options_the_role_sets_are_the_ones_the_spec_refuses_and_the_preflight_refuses_them(tmp_path):
    from provisioner.spec.cross_checks import DEDICATED_OPTIONS
    from provisioner.spec.models import GROUP_OPTIONS

    owned = yaml.safe_load((ROLES_DIR / "vllm_service/vars/main.yml").read_text())["_vllm_service_owned_options"]
    # the spec's: its dedicated fields' options and config; the multi-node launcher's the inventory writes itself
    assert sorted(owned) == sorted({*DEDICATED_OPTIONS, "config"} - set(GROUP_OPTIONS))
    refused = [*owned, *[option.replace("-", "_") for option in owned if "-" in option]]
    for option in refused:
        (problem,) = problems_of(spec_data(instances=[instance("chat", 8000, options={option: 1})]))
        assert problem.startswith(f"instances[0].options.{option}: "), problem
    entries = [_service_entry(options={option: 1}) for option in [*refused, "max-model-len", "max_model_len"]]
    assert _vllm_service_check(tmp_path, entries) == [False] * len(refused) + [True, True]


def test_the_env_the_role_sets_is_what_the_spec_refuses_and_its_probe_knows_every_any_address():
    import re

    from provisioner.spec.cross_checks import MANAGED_ENV
    from provisioner.vllm.serve_args import ANY_ADDRESS

    managed = yaml.safe_load((ROLES_DIR / "vllm_service/vars/main.yml").read_text())["_vllm_service_managed_env"]
    assert sorted(managed) == sorted(MANAGED_ENV)
    template = (ROLES_DIR / "vllm_service/templates/vllm-instance.common.j2").read_text()
    (listed,) = re.findall(r"if bind in (\[.*?\]) else", template)
    assert sorted(yaml.safe_load(listed)) == sorted(ANY_ADDRESS)


@pytest.mark.parametrize("term", ["ttft_p99<=" + "9" * 400 + "ms", "ttft_p99<=0ms", "ttft_p99<=3601s",
                                  "goodput>=" + "9" * 400 + "%,ttft<=200ms", "goodput>=0%,ttft<=200ms",
                                  "ttft_p99<=١٠ms"])
def test_tune_refuses_an_slo_limit_every_candidate_or_none_would_meet(term):
    with pytest.raises(SloError):
        parse_slo(term)
    assert parse_slo("ttft_p99<=3600s,itl_p99<=0.5ms").text == "ttft_p99<=3.6e+06ms,itl_p99<=0.5ms"


def test_the_spec_refuses_an_slo_longer_than_an_hour():
    data = spec_data(instances=[instance("chat", 8000, slo={"ttft_p99_ms": 10**40})])
    assert problems_of(data) == [f"instances[0].slo.ttft_p99_ms: must be at most 3600000, got {10**40} (int)"]
