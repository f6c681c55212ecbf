"""Each vLLM unit (role vllm_service): loaded, enabled, active, its settings as `systemctl show` reports
them, its environment, its command line, its env file, its `vllm serve --config` file, and the server
answering on its address.

Spec mode expects what the role's template renders for the instance; profile mode applies the
profile's rules to each unit that discovery found.
"""

import json

from provisioner.audit.checks import UNSET, each, matches, shown
from provisioner.audit.suite.instance_files import (
    expect_config_file,
    expect_env_file_content,
    expect_env_file_mode,
    expect_env_file_owner,
)
from provisioner.secrets import REDACTED, is_secret_name, shown_command

units = each(lambda expected: expected["units"], ids=lambda unit: unit["name"])


def per_unit(key: str):
    """The check runs once per (unit, name) of each unit's `key` mapping (properties, environment)."""
    return each(
        lambda expected: [(unit, name, value) for unit in expected["units"] for name, value in unit[key].items()],
        ids=lambda entry: f"{entry[0]['name']}-{entry[1]}",
    )


@units
def test_loaded(case, facts, audit):
    unit = case.item
    shown_state = facts.units[unit["name"]].shown
    actual = shown_state["LoadState"]
    if actual == "loaded":
        actual = f"loaded from {shown_state['FragmentPath']}"
    audit.expect(f"{unit['name']}: unit file", f"loaded from {unit['fragment']}", actual)


@units
def test_enabled(case, facts, audit):
    unit = case.item
    audit.expect(f"{unit['name']}: enabled", "enabled", facts.units[unit["name"]].shown.get("UnitFileState") or UNSET)


@units
def test_active(case, facts, audit):
    unit = case.item
    state = facts.units[unit["name"]].shown
    actual = state["ActiveState"] if state["ActiveState"] == "active" else f"{state['ActiveState']} ({state['SubState']})"
    audit.expect(f"{unit['name']}: active", "active", actual)


@units
def test_unit_file_reloaded(case, facts, audit):
    unit = case.item
    audit.expect(f"{unit['name']}: NeedDaemonReload", "no", facts.units[unit["name"]].shown.get("NeedDaemonReload"))


@per_unit("properties")
def test_property(case, facts, audit):
    unit, name, expected = case.item
    audit.expect(f"{unit['name']}: {name}", expected, facts.units[unit["name"]].shown.get(name) or UNSET)


@per_unit("environment")
def test_environment(case, facts, audit):
    unit, name, expected = case.item
    actual = facts.units[unit["name"]].environment.get(name, UNSET)
    if is_secret_name(name):  # compared, never shown
        passed = matches(expected, actual)
        shown_actual = actual if actual == UNSET else REDACTED if passed else f"{REDACTED} (another value)"
        audit.expect(f"{unit['name']}: Environment {name}", expected if isinstance(expected, dict) else REDACTED,
                     shown_actual, passed=passed)
    else:
        audit.expect(f"{unit['name']}: Environment {name}", expected, actual)


@units
def test_command_line(case, facts, audit):
    unit = case.item
    audit.expect(f"{unit['name']}: ExecStart", unit["command_line"], shown_command(facts.units[unit["name"]].argv))


def units_with(key: str):
    """The check runs once per unit whose expectations have `key` (spec mode: env_file, config_file)."""
    return each(lambda expected: [unit for unit in expected["units"] if unit.get(key)], ids=lambda unit: unit["name"])


env_files = units_with("env_file")


@env_files
def test_env_file_mode(case, facts, audit):
    unit = case.item
    expect_env_file_mode(audit, f"{unit['name']}: EnvironmentFile", unit["env_file"], facts.units[unit["name"]].env_file)


@env_files
def test_env_file_owner(case, facts, audit):
    unit = case.item
    expect_env_file_owner(audit, f"{unit['name']}: EnvironmentFile", unit["env_file"], facts.units[unit["name"]].env_file)


@env_files
def test_env_file_content(case, facts, audit):
    unit = case.item
    expect_env_file_content(audit, f"{unit['name']}: EnvironmentFile", unit["env_file"],
                            facts.units[unit["name"]].env_file_sha256)


config_files = units_with("config_file")


@config_files
def test_config_file(case, facts, audit):
    unit = case.item
    expect_config_file(audit, unit["name"], unit["config_file"], facts.units[unit["name"]].config_text)


@units
def test_listening(case, facts, audit):
    unit = case.item
    port = unit["listen"].rsplit(":", 1)[1]
    on_port = sorted(address for address in facts.listening if address.rsplit(":", 1)[1] == port)
    audit.expect(f"{unit['name']}: listening", unit["listen"], on_port or f"nothing on port {port}",
                 passed=unit["listen"] in on_port)


@units
def test_health(case, facts, audit):
    unit = case.item
    answer = facts.units[unit["name"]].http.get("/health", {"error": "no answer"})
    audit.expect(f"{unit['name']}: GET /health", "200", answer.get("status", answer.get("error")))


@units
def test_served_models(case, facts, audit):
    unit = case.item
    answer = facts.units[unit["name"]].http.get("/v1/models", {"error": "no answer"})
    audit.expect(f"{unit['name']}: GET /v1/models", shown(unit["served_names"]), model_ids(answer))


def model_ids(answer: dict) -> str | list[str]:
    """The model ids of a /v1/models answer, or what came instead."""
    if "error" in answer:
        return answer["error"]
    if answer["status"] != 200:
        return f"HTTP {answer['status']}"
    try:
        return [model["id"] for model in json.loads(answer["body"])["data"]]
    except (ValueError, KeyError, TypeError):
        return f"not a list of models: {answer['body'][:80]}"


@units
def test_ready(case, facts, audit):
    """The units' own readiness probe, once: /health, then one real request (a 1-token completion,
    one embedding or one rerank, whichever the model serves) with the server's API key."""
    unit = case.item
    ready = facts.units[unit["name"]].ready
    lines = (ready.text.strip().splitlines() or ["no output"]) if ready else ["not probed"]
    verdict = lines[-1].removeprefix("wait-ready: ")
    audit.expect(f"{unit['name']}: ready (one request served)", "ready", verdict,
                 passed=ready is not None and ready.rc == 0)
