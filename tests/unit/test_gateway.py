"""Gateways: the spec's checks word for word, the inventory they make, the haproxy.cfg role gateway renders
(parsed: a route per served model, a server line per replica, the completion health check), the plan."""

from __future__ import annotations

import io
import re
import shlex
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from provisioner.cli.plan_view import plan_json, show_host_plan
from provisioner.fleet.inventory import build_inventory
from provisioner.plan import build_plan
from provisioner.spec import validate_spec
from tests.unit.conftest import UUID1, host, instance, problems_of

KEY = "sk-gateway-test-0123456789"


def two_hosts() -> list[dict]:
    return [host("gpu-a", "192.0.2.21"),
            host("gpu-b", "192.0.2.22", gpus={"devices": [{"index": 0, "uuid": UUID1, "model": "NVIDIA GeForce RTX 4070"}]}),
            {"name": "edge", "address": "192.0.2.30"}]


def replicas(tmp_path: Path, key_b: str | None = KEY, **extra) -> list[dict]:
    (tmp_path / "a.key").write_text(KEY + "\n")
    fields_b = {}
    if key_b is not None:
        (tmp_path / "b.key").write_text(key_b + "\n")
        fields_b["api_key_file"] = "b.key"
    return [
        instance("qwen-a", 8000, on="gpu-a", bind="0.0.0.0", api_key_file="a.key", **extra),
        instance("qwen-b", 8000, on="gpu-b", bind="192.0.2.22", **fields_b, **extra),
    ]


def gateway_spec(tmp_path: Path, gateways: list[dict] | None = None, instances: list[dict] | None = None,
                 hosts: list[dict] | None = None) -> dict:
    return {"version": 1, "hosts": hosts or two_hosts(),
            "instances": replicas(tmp_path) if instances is None else instances,
            "gateways": [{"name": "public", "host": "edge"}] if gateways is None else gateways}


# ------------------------------------------------------------------ spec


def test_a_gateway_over_two_replicas_is_valid_with_its_defaults(tmp_path):
    spec = validate_spec(gateway_spec(tmp_path), base_dir=tmp_path)
    (gateway,) = spec.gateways
    assert (gateway.port, gateway.bind, gateway.tls_certificate, gateway.models) == (8080, "0.0.0.0", None, None)
    assert [i.served_names for i in spec.instances] == [["Qwen/Qwen3-1.7B-FP8"]] * 2


def test_unknown_host_of_a_gateway(tmp_path):
    assert problems_of(gateway_spec(tmp_path, [{"name": "public", "host": "egde"}]), tmp_path) == [
        "gateways[0].host: unknown host 'egde' — did you mean 'edge'? hosts in this spec: gpu-a, gpu-b, edge"]


def test_a_model_no_instance_serves(tmp_path):
    data = gateway_spec(tmp_path, [{"name": "public", "host": "edge", "models": ["Qwen/Qwen3-1.7B-FP8", "llama"]}])
    assert problems_of(data, tmp_path) == [
        "gateways[0].models[1]: no instance serves 'llama' (served names in this spec: Qwen/Qwen3-1.7B-FP8) — add an "
        "instance that serves it, or remove it from models"]


def test_a_served_model_name_is_what_a_gateway_routes(tmp_path):
    instances = replicas(tmp_path, options={"served-model-name": "qwen"})
    data = gateway_spec(tmp_path, [{"name": "public", "host": "edge", "models": ["qwen"]}], instances)
    assert validate_spec(data, base_dir=tmp_path).gateways[0].models == ["qwen"]


def test_empty_and_repeated_models(tmp_path):
    data = gateway_spec(tmp_path, [{"name": "public", "host": "edge", "models": []},
                                   {"name": "other", "host": "edge", "port": 8081,
                                    "models": ["Qwen/Qwen3-1.7B-FP8", "Qwen/Qwen3-1.7B-FP8"]}])
    assert problems_of(data, tmp_path) == [
        "gateways[0].models: is empty — list the served names to route, or leave models out to route every served name",
        "gateways[1].models[1]: 'Qwen/Qwen3-1.7B-FP8' is listed twice — list each served name once"]


def test_a_gateway_without_any_served_model(tmp_path):
    assert problems_of(gateway_spec(tmp_path, instances=[]), tmp_path) == [
        "gateways[0]: no instance serves a model for gateway 'public' to route — add instances, or remove the gateway"]


def test_port_clash_with_an_instance_and_with_another_gateway(tmp_path):
    data = gateway_spec(tmp_path, [{"name": "public", "host": "gpu-a", "port": 8000},
                                   {"name": "one", "host": "edge"}, {"name": "two", "host": "edge"}])
    assert problems_of(data, tmp_path) == [
        "gateways[0].port: port 8000 on host gpu-a is already used by instance 'qwen-a' (instances[0].port) — give the "
        "gateway another port",
        "gateways[2].port: port 8080 on host edge is already used by gateway 'one' (gateways[1].port) — give each "
        "gateway on a host its own port"]


def test_duplicate_gateway_names(tmp_path):
    data = gateway_spec(tmp_path, [{"name": "public", "host": "edge"}, {"name": "public", "host": "gpu-a"}])
    assert problems_of(data, tmp_path) == [
        "gateways[1].name: duplicate gateway name 'public' (also gateways[0]) — give each gateway its own name"]


def test_replicas_with_different_keys(tmp_path):
    data = gateway_spec(tmp_path, instances=replicas(tmp_path, key_b="sk-other"))
    assert problems_of(data, tmp_path) == [
        "instances[1].api_key_file: the replicas of 'Qwen/Qwen3-1.7B-FP8' behind gateway 'public' (gateways[0]) must "
        "share one API key (the client's key goes to any of them), but this file's content differs from the key of "
        "instance 'qwen-a' (instances[0]) — give every replica of 'Qwen/Qwen3-1.7B-FP8' the same api_key_file content"]


def test_a_replica_without_a_key_beside_one_with_a_key(tmp_path):
    data = gateway_spec(tmp_path, instances=replicas(tmp_path, key_b=None))
    assert problems_of(data, tmp_path) == [
        "instances[1].api_key_file: the replicas of 'Qwen/Qwen3-1.7B-FP8' behind gateway 'public' (gateways[0]) must "
        "share one API key (the client's key goes to any of them), but instance 'qwen-a' (instances[0]) has an API "
        "key and this instance none — give every replica of 'Qwen/Qwen3-1.7B-FP8' the same api_key_file content"]


def test_the_same_key_in_two_files_is_one_key(tmp_path):
    instances = replicas(tmp_path)
    (tmp_path / "b.key").write_text(KEY)  # no newline: Ansible's file lookup strips it
    assert len(validate_spec(gateway_spec(tmp_path, instances=instances), base_dir=tmp_path).instances) == 2


def test_a_loopback_replica_of_a_gateway_on_another_host(tmp_path):
    instances = replicas(tmp_path)
    instances[1]["bind"] = "127.0.0.1"
    assert problems_of(gateway_spec(tmp_path, instances=instances), tmp_path) == [
        "instances[1].bind: 127.0.0.1 is reachable from host gpu-b only, but gateway 'public' (gateways[0]) on host "
        "edge routes 'Qwen/Qwen3-1.7B-FP8' to this instance — bind 0.0.0.0 or the host's address"]


def test_a_loopback_replica_on_the_gateways_own_host_is_fine(tmp_path):
    instances = replicas(tmp_path)
    instances[1]["bind"] = "127.0.0.1"
    data = gateway_spec(tmp_path, [{"name": "public", "host": "gpu-b"}], instances)
    assert validate_spec(data, base_dir=tmp_path).gateways[0].host == "gpu-b"


def test_a_missing_certificate_and_the_reserved_group(tmp_path):
    hosts = two_hosts()
    hosts[2]["groups"] = ["gateway"]
    data = gateway_spec(tmp_path, [{"name": "public", "host": "edge", "tls_certificate": "tls/edge.pem"}], hosts=hosts)
    assert problems_of(data, tmp_path) == [
        "hosts[2].groups[0]: 'gateway' is the group of the hosts that run a gateway (the inventory makes it) — choose "
        "another name",
        f"gateways[0].tls_certificate: {tmp_path}/tls/edge.pem does not exist — create it with the certificate and its "
        "private key (PEM, as HAProxy's `ssl crt` reads them) or correct the path"]


def test_unknown_key_of_a_gateway(tmp_path):
    data = gateway_spec(tmp_path, [{"name": "public", "host": "edge", "tls": True}])
    (problem,) = problems_of(data, tmp_path)
    assert problem.startswith("gateways[0].tls: unknown key 'tls'")


# ------------------------------------------------------------------ inventory


def test_the_inventory_puts_the_gateway_host_in_group_gateway_with_its_routes(tmp_path):
    spec = validate_spec(gateway_spec(tmp_path), base_dir=tmp_path)
    files = build_inventory(spec)
    group = files["hosts.yml"]["all"]["children"]["vllm_hosts"]
    assert group["children"] == {"gateway": {"hosts": {"edge": {}}}, "monitoring": {}}
    assert files["host_vars/edge.yml"]["gateway_frontends"] == [{
        "name": "public", "bind": "0.0.0.0", "port": 8080, "tls_certificate": None,
        "routes": [{"model": "Qwen/Qwen3-1.7B-FP8", "backend": "public-0", "api_key_file": str(tmp_path / "a.key"),
                    "servers": [{"name": "qwen-a", "address": "192.0.2.21", "port": 8000},  # 0.0.0.0: the host's address
                                {"name": "qwen-b", "address": "192.0.2.22", "port": 8000}]}],  # its bind address
    }]
    assert "gateway_frontends" not in files["host_vars/gpu-a.yml"]
    # what role rollout drains on each replica's host while a rolling apply changes it
    assert files["host_vars/gpu-a.yml"]["rollout_gateway_servers"] == [
        {"gateway": "edge", "backend": "public-0", "server": "qwen-a", "model": "Qwen/Qwen3-1.7B-FP8"}]
    assert files["host_vars/gpu-b.yml"]["rollout_gateway_servers"] == [
        {"gateway": "edge", "backend": "public-0", "server": "qwen-b", "model": "Qwen/Qwen3-1.7B-FP8"}]
    assert "rollout_gateway_servers" not in files["host_vars/edge.yml"]  # it serves no replica


def test_an_inventory_without_gateways_has_an_empty_gateway_group():
    """Empty, not absent: plain ansible-playbook warns of a play's pattern that names no group."""
    from tests.unit.conftest import spec_data
    files = build_inventory(validate_spec(spec_data()))
    assert files["hosts.yml"]["all"]["children"]["vllm_hosts"]["children"] == {"gateway": {}, "monitoring": {}}


# ------------------------------------------------------------------ haproxy.cfg


def sections(config: str) -> dict[str, list[str]]:
    """haproxy.cfg as HAProxy reads it: section header → its lines (comments and blank lines dropped)."""
    parsed: dict[str, list[str]] = {}
    current = None
    for raw in config.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if not raw[0].isspace():
            current = line
            parsed[current] = []
        else:
            parsed[current].append(line)
    return parsed


def gateway_plan(tmp_path: Path, **gateway):
    data = gateway_spec(tmp_path, [{"name": "public", "host": "edge", **gateway}],
                        instances=[*replicas(tmp_path),
                                   instance("small", 8001, share=0.2, on="gpu-a", bind="0.0.0.0", model="tiny/model")])
    spec = validate_spec(data, base_dir=tmp_path)
    (plan,) = build_plan(spec, ["edge"])
    return plan


def test_haproxy_cfg_has_a_route_per_model_and_a_checked_server_per_replica(tmp_path):
    plan = gateway_plan(tmp_path)
    assert (plan.gateway_file.path, plan.gateway_file.mode, plan.gateway_file.role) == \
        ("/etc/haproxy/haproxy.cfg", "0640", "gateway")
    config = sections(plan.gateway_file.content)
    frontend = config["frontend public"]
    assert frontend[0] == "bind 0.0.0.0:8080"
    assert "http-request wait-for-body time 10s" in frontend
    assert "http-request set-var(txn.model) req.body,json_query('$.model')" in frontend
    assert [line for line in frontend if line.startswith(("use_backend", "default_backend"))] == [
        "use_backend public-0 if { var(txn.model) -m str 'Qwen/Qwen3-1.7B-FP8' }",
        "use_backend public-1 if { var(txn.model) -m str 'tiny/model' }",
        "default_backend public-unknown-model"]
    models = next(line for line in frontend if "/v1/models" in line)
    assert '{"id":"Qwen/Qwen3-1.7B-FP8","object":"model"' in models and '{"id":"tiny/model"' in models

    qwen, tiny = config["backend public-0"], config["backend public-1"]
    assert [line for line in qwen if line.startswith("server")] == [
        "server qwen-a 192.0.2.21:8000", "server qwen-b 192.0.2.22:8000"]
    assert [line for line in tiny if line.startswith("server")] == ["server small 192.0.2.21:8001"]
    for backend in (qwen, tiny):
        assert "option httpchk" in backend and "http-check expect status 200" in backend
        assert "default-server check inter 2s fall 2 rise 1" in backend
    send = shlex.split(next(line for line in qwen if line.startswith("http-check send")))
    assert send[:7] == ["http-check", "send", "meth", "POST", "uri", "/v1/completions", "ver"]
    assert yaml.safe_load(send[send.index("body") + 1]) == {"max_tokens": 1, "model": "Qwen/Qwen3-1.7B-FP8", "prompt": "ping"}
    # the route's key, redacted in the plan (the role reads the file); no key: no header
    assert send[send.index("Authorization") + 1] == f"Bearer <redacted: {len(KEY)} bytes from {tmp_path / 'a.key'}>"
    assert "Authorization" not in next(line for line in tiny if line.startswith("http-check send"))
    assert KEY not in plan.gateway_file.content

    unknown = config["backend public-unknown-model"]
    (answer,) = unknown
    assert answer.startswith("http-request return status 404 content-type application/json string ")
    assert yaml.safe_load(shlex.split(answer)[-1])["error"]["code"] == 404


def test_tls_binds_with_the_certificate(tmp_path):
    (tmp_path / "edge.pem").write_text("-----BEGIN CERTIFICATE-----\n")
    plan = gateway_plan(tmp_path, tls_certificate="edge.pem", port=8443)
    assert sections(plan.gateway_file.content)["frontend public"][0] == \
        "bind 0.0.0.0:8443 ssl crt /etc/haproxy/certs/public.pem"
    assert plan.routes[0].url == "https://192.0.2.30:8443/v1"


# ------------------------------------------------------------------ plan


def test_the_plan_shows_each_route_with_its_replicas_and_the_file(tmp_path):
    plan = gateway_plan(tmp_path)
    assert [(r.gateway, r.url, r.model, r.replicas) for r in plan.routes] == [
        ("public", "http://192.0.2.30:8080/v1", "Qwen/Qwen3-1.7B-FP8",
         ["qwen-a 192.0.2.21:8000", "qwen-b 192.0.2.22:8000"]),
        ("public", "http://192.0.2.30:8080/v1", "tiny/model", ["small 192.0.2.21:8001"])]
    assert plan.files[-1] == plan.gateway_file
    console = Console(file=io.StringIO(), width=200)
    show_host_plan(console, plan)
    text = console.file.getvalue()
    assert re.search(r"public\s+│\s+http://192.0.2.30:8080/v1\s+│\s+Qwen/Qwen3-1.7B-FP8\s+│\s+qwen-a 192.0.2.21:8000, "
                     r"qwen-b 192.0.2.22:8000", text)
    assert "/etc/haproxy/haproxy.cfg (mode 0640, role gateway)" in text
    assert KEY not in text and KEY not in str(plan_json(Path("spec.yml"), [plan], []))


def test_a_host_without_gateways_plans_no_gateway_file(tmp_path):
    spec = validate_spec(gateway_spec(tmp_path), base_dir=tmp_path)
    (plan,) = build_plan(spec, ["gpu-a"])
    assert plan.gateway_file is None and plan.routes == []


def test_the_planned_haproxy_cfg_is_what_ansible_renders(tmp_path):
    from provisioner.base.paths import ROLES_DIR
    from provisioner.validation.roles import host_variables
    from tests.unit.test_plan_matches_ansible import ansible_render

    (tmp_path / "edge.pem").write_text("-----BEGIN CERTIFICATE-----\n")
    plan = gateway_plan(tmp_path, tls_certificate="edge.pem")
    spec = validate_spec(gateway_spec(tmp_path, [{"name": "public", "host": "edge", "tls_certificate": "edge.pem"}],
                                      [*replicas(tmp_path), instance("small", 8001, share=0.2, on="gpu-a",
                                                                     bind="0.0.0.0", model="tiny/model")]),
                         base_dir=tmp_path)
    variables = host_variables(spec.host("edge"), [], spec)
    keys = {str(tmp_path / "a.key"): f"<redacted: {len(KEY)} bytes from {tmp_path / 'a.key'}>"}
    rendered = ansible_render(ROLES_DIR / "gateway/templates/haproxy.cfg.j2", {**variables, "gateway_api_keys": keys})
    assert rendered == plan.gateway_file.content
