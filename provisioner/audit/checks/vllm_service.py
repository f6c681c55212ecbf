"""Each vLLM unit (role vllm_service): loaded, enabled, active, its drop-ins, its settings as `systemctl show`
reports them (a value a drop-in changed names the drop-in), its environment, its command line, its env file,
its `vllm serve --config` file, and the server answering on its address.

Spec mode expects what the role's template renders for the instance; profile mode applies the
profile's rules to each unit that discovery found. A unit systemd did not load (masked, not found, a bad
setting) fails its `unit file` row, which says what and how to fix it; its other rows are n/a.

What runs, beside the files (spec mode): each unit's process against the files it was started from and the
vLLM it imported, and every vLLM server or GPU process on the host that the spec does not declare
(provisioner/audit/processes.py reads them on the host, provisioner/audit/running.py compares). The API
probes ask with the key the spec declares (read here, sent on the SSH session's standard input), never
the server's own: profile mode, which has no spec, asks with the server's own key and says where it came from.
"""

import base64
import ipaddress
import json
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from provisioner.audit import running
from provisioner.audit.discovery import compute_apps, parsed_config, process_scan, processes_command, supervision
from provisioner.audit.engine import Output
from provisioner.audit.expectations import TIME_SPANS
from provisioner.audit.instance_files import (
    PROBE_TIMEOUT_S,
    env_file_command,
    env_file_stat,
    expect_config_file,
    expect_env_file_content,
    expect_env_file_mode,
    expect_env_file_owner,
    http_answers,
    http_probe_command,
    key_source,
)
from provisioner.audit.registry import REPORTED, UNSET, each, matches, shown
from provisioner.audit.sockets import COMMANDS as TCP_TABLES
from provisioner.audit.sockets import connected, listening_on, read_tables
from provisioner.audit.text import environment_words, shown_argv
from provisioner.base.module_utils import (
    systemd_dropins as dropins,  # the role's module judges drop-ins with the same code
)
from provisioner.base.paths import role_dir
from provisioner.base.secrets import REDACTED, is_secret_name, read_api_key, shown_command
from provisioner.vllm.serve_args import bracketed, command_options, config_options

READY_PROBE = role_dir("vllm_service") / "files" / "wait-ready"  # the units' own readiness probe
UNIT_STATE = ("LoadState", "LoadError", "FragmentPath", "UnitFileState", "ActiveState", "SubState", "NeedDaemonReload",
              "Environment", "ExecStart", "DropInPaths", "MainPID")
COMPUTE_APPS = "{smi} --query-compute-apps=pid,used_memory,gpu_uuid --format=csv,noheader,nounits"


@dataclass
class UnitFacts:
    shown: dict[str, str]  # `systemctl show` properties
    environment: dict[str, str]  # Environment= and the EnvironmentFile= variables the checks ask about
    env_file: tuple[str, str] | None  # (mode, owner:group) of the expected env file; None: absent
    env_file_sha256: str | None
    http: dict[str, Any]
    config_text: str | None = None  # the expected --config file's content; None: absent
    ready: Output | None = None  # the readiness probe's verdict (exit 0: ready) and its line
    dropins: list[tuple[str, str]] = field(default_factory=list)  # (path, content) of each DropInPaths file, in order
    dropin_modes: dict[str, str] = field(default_factory=dict)  # path → mode (0644) of each DropInPaths file

    @property
    def argv(self) -> list[str]:
        return shown_argv(self.shown.get("ExecStart", ""))


def commands(expected):
    found = dict(TCP_TABLES)  # the listening sockets and the established connections (multi-node instances)
    for index, unit in enumerate(expected["units"]):
        found.update(unit_commands(index, unit))
    if expected.get("running"):
        found.update(running_commands(expected))
    return found


def secrets(expected):
    """Spec mode: per unit, the API key the spec declares ('' for none), which its probes ask with."""
    return {key_variable(index): read_api_key(unit["api_key"]["file"]) if unit["api_key"]["file"] else ""
            for index, unit in enumerate(expected["units"]) if "api_key" in unit}


def key_variable(index: int) -> str:
    return f"vp_api_key{index}"


def read(expected, out):
    return {
        **read_tables(out),
        "units": {unit["name"]: parse_unit(index, out) for index, unit in enumerate(expected["units"])},
        **(read_running(out) if expected.get("running") else {}),
    }


def running_commands(expected) -> dict[str, str]:
    """The running servers (with the times of each unit's files and the venv's `current` link) and, where GPUs
    are expected, the GPU processes."""
    files = [path for unit in expected["units"] for path in unit["started_from"]]
    files += [expected["vllm_install"]["current"]] if expected.get("vllm_install") else []
    found = {"processes": processes_command({"files": files})}
    if expected.get("gpu") or expected.get("driver"):
        nvidia_smi = (expected.get("gpu") or expected["driver"])["nvidia_smi"]
        found["compute_apps"] = COMPUTE_APPS.format(smi=shlex.quote(nvidia_smi))
    return found


def read_running(out) -> dict[str, Any]:
    """processes.py's answer (or why it could not be read) and the GPU processes (None: not read, or not asked)."""
    scan, problem = process_scan(out["processes"])
    apps = out.get("compute_apps")
    return {"processes": None if problem else scan, "processes_problem": problem,
            "compute_apps": compute_apps(apps.text) if apps is not None and apps.rc == 0 else None,
            "compute_apps_problem": last_line(apps) if apps is not None and apps.rc != 0 else None}


def last_line(out: Output) -> str:
    lines = out.text.strip().splitlines()
    return f"exit {out.rc}: {lines[-1] if lines else 'no output'}"


def unit_commands(index: int, unit: dict[str, Any]) -> dict[str, str]:
    name = shlex.quote(unit["name"])
    properties = ",".join([*UNIT_STATE, *unit["properties"]])
    variables = "|".join(map(re.escape, unit["environment"])) or "^$"
    found = {
        f"unit{index}": f"systemctl show {name} --property={properties}",
        # only the variables the checks ask about: an env file may hold secrets
        f"unit_env{index}": (
            f"systemctl show {name} -p EnvironmentFiles --value | while read -r file rest; do cat \"$file\"; done"
            f" | grep -E {shlex.quote(f'^({variables})=')}"
        ),
    }
    headless = bool((unit.get("group") or {}).get("headless"))  # a follower node: no API to ask
    # spec mode: the probes ask with the key the spec declares (a secret read from stdin), never the server's own
    key = key_variable(index) if "api_key" in unit else None
    if not headless:
        found[f"http{index}"] = http_probe_command(name, unit["url"], key)
    # each drop-in systemd applies: its path, then its content in base64 (one line: no framing to escape)
    found[f"dropins{index}"] = (
        f"for file in $(systemctl show {name} -p DropInPaths --value); do echo \"$file\"; base64 -w0 \"$file\" 2>/dev/null; echo; done")
    found[f"dropin_modes{index}"] = (
        f"for file in $(systemctl show {name} -p DropInPaths --value); do stat -c '%a %n' \"$file\"; done")
    # one real request through the same probe the unit runs before it turns active
    found[f"ready{index}"] = "true" if headless else (
        (f'VLLM_API_KEY="${key}" ' if key else "")
        + f"timeout {PROBE_TIMEOUT_S + 2} python3 -c {shlex.quote(READY_PROBE.read_text())}"
        f" --base-url {shlex.quote(unit['url'])} --model {shlex.quote(unit['served_names'][0])}"
        f" --timeout {PROBE_TIMEOUT_S} --once"
        + ("" if key else f" --key-from-unit {name}"))
    if unit.get("env_file"):
        found[f"env_file{index}"] = env_file_command(unit["env_file"]["path"])
    if unit.get("config_file"):
        found[f"config{index}"] = f"cat {shlex.quote(unit['config_file']['path'])}"
    return found


def parse_unit(index: int, out: dict[str, Output]) -> UnitFacts:
    shown_state = dict(line.split("=", 1) for line in out[f"unit{index}"].text.splitlines() if "=" in line)
    environment = environment_words(shown_state.get("Environment", ""))
    environment.update(line.split("=", 1) for line in out[f"unit_env{index}"].text.splitlines() if "=" in line)
    stat, sha256 = env_file_stat(out.get(f"env_file{index}"))
    config = out.get(f"config{index}")
    http = out.get(f"http{index}")
    answers = {**http_answers(http.text), **key_source(http.text)} if http else {}
    return UnitFacts(shown_state, environment, stat, sha256, answers,
                     config.text if config is not None and config.rc == 0 else None, out.get(f"ready{index}"),
                     dropin_files(out.get(f"dropins{index}")), dropin_modes(out.get(f"dropin_modes{index}")))


def dropin_modes(out: Output | None) -> dict[str, str]:
    """{path: mode} of the drop-in modes command's lines (`644 /etc/systemd/system/x.service.d/y.conf`)."""
    lines = out.text.splitlines() if out is not None else []
    return {path: mode.zfill(4) for mode, _, path in (line.partition(" ") for line in lines) if path}


def dropin_files(out: Output | None) -> list[tuple[str, str]]:
    """[(path, content)] of the drop-ins command's lines: a path, then the file's content in base64."""
    lines = out.text.splitlines() if out is not None else []
    return [(path, base64.b64decode(encoded).decode("utf-8", "replace")) for path, encoded in zip(lines[::2], lines[1::2])]

units = each(lambda expected: expected["units"], ids=lambda unit: unit["name"])
# the units that serve an API: all but the headless nodes of multi-node instances
serving = each(lambda expected: [unit for unit in expected["units"] if not (unit.get("group") or {}).get("headless")],
               ids=lambda unit: unit["name"])
# the nodes of multi-node instances
nodes = each(lambda expected: [unit for unit in expected["units"] if unit.get("group")], ids=lambda unit: unit["name"])
NO_MANAGED_DROPINS = "none that change a managed setting"
NOT_LOADED = {"masked": "the unit is masked", "not-found": "the unit file is missing",
              "bad-setting": "the unit has a bad setting", "error": "systemd could not load the unit"}
UNIT_KEYS = {shown_name: key for key, shown_name in TIME_SPANS.items()}  # `systemctl show` name → unit file key


def loaded(audit, unit: dict, facts, check: str, expected) -> None:
    """Go on only where systemd loaded the unit; else the row is n/a, pointing at the `unit file` row."""
    state = facts.units[unit["name"]].shown.get("LoadState", "")
    if state != "loaded":
        why = NOT_LOADED.get(state, f"the unit is {state or 'unknown to systemd'}")
        audit.not_applicable(check, expected, f"{why}: see {unit['name']}: unit file")


def unit_dropins(unit: dict, facts) -> list[tuple[str, list[dict]]]:
    """(path, its changes) of each drop-in systemd applies to the unit, in order."""
    return [(path, dropins.dropin_changes(text, unit.get("managed"))) for path, text in facts.units[unit["name"]].dropins]


def from_dropin(unit: dict, facts, setting: str) -> str:
    """" (from PATH)" where a drop-in changes `setting` (a unit file key or "Environment NAME"): the last
    one systemd applies; "" where none does."""
    paths = [path for path, changes in unit_dropins(unit, facts) if dropins.touches(changes, setting)]
    return f" (from {paths[-1]})" if paths else ""


def per_unit(key: str):
    """The check runs once per (unit, name) of each unit's `key` mapping (properties, environment)."""
    return each(
        lambda expected: [(unit, name, value) for unit in expected["units"] for name, value in unit[key].items()],
        ids=lambda entry: f"{entry[0]['name']}-{entry[1]}",
    )


@units
def unit_file(case, facts, audit):
    """`UNIT: unit file` — the unit's load state and the file systemd loaded it from, against our unit's path.

    Modes: spec, profile.

    A unit systemd did not load fails here alone, saying what and how to fix it: `masked (PATH -> /dev/null):
    provision apply unmasks it …`, `not found (no PATH): provision apply writes it`, `bad-setting: …`; every
    other row of the unit is then n/a (`the unit is masked: see UNIT: unit file`).
    """
    unit = case.item
    shown_state = facts.units[unit["name"]].shown
    actual = shown_state.get("LoadState") or "unknown to systemd"
    if actual == "loaded":
        actual = f"loaded from {shown_state['FragmentPath']}"
    else:
        actual = not_loaded(unit, shown_state, facts.units[unit["name"]].dropins)
    audit.expect(f"{unit['name']}: unit file", f"loaded from {unit['fragment']}", actual)


def not_loaded(unit: dict, shown_state: dict, found_dropins: list) -> str:
    """What is wrong with a unit systemd did not load, and how to fix it."""
    name, state, ours = unit["name"], shown_state.get("LoadState") or "unknown", unit.get("managed") is not None
    fragment = shown_state.get("FragmentPath") or unit["fragment"]
    if state == "masked":
        runtime = " --runtime" if fragment.startswith("/run/") else ""
        fix = f"systemctl unmask{runtime} {name}"
        return f"masked ({fragment} -> /dev/null): " + (
            f"provision apply unmasks it (by hand: {fix}, then provision apply)" if ours else fix)
    if state == "not-found":
        return f"not found (no {unit['fragment']}): provision apply writes it" if ours else "not found"
    error = shown_state.get("LoadError", "").partition(" ")[2].strip('"') or "no reason given"
    where = ", ".join([fragment, *(path for path, _ in found_dropins)])
    return (f"{state}: {error} ({where}): `systemd-analyze verify {name}` names the setting"
            + ("; provision apply rewrites the unit and removes its own drop-ins that change it" if ours else ""))


@units
def enabled(case, facts, audit):
    """`UNIT: enabled` — the unit file state (`systemctl show UnitFileState`) against `enabled`.

    Modes: spec, profile.
    """
    unit = case.item
    loaded(audit, unit, facts, f"{unit['name']}: enabled", "enabled")
    audit.expect(f"{unit['name']}: enabled", "enabled", facts.units[unit["name"]].shown.get("UnitFileState") or UNSET)


@units
def active(case, facts, audit):
    """`UNIT: active` — the unit's ActiveState (and SubState when not active) against `active`.

    Modes: spec, profile.
    """
    unit = case.item
    loaded(audit, unit, facts, f"{unit['name']}: active", "active")
    state = facts.units[unit["name"]].shown
    actual = state["ActiveState"] if state["ActiveState"] == "active" else f"{state['ActiveState']} ({state['SubState']})"
    audit.expect(f"{unit['name']}: active", "active", actual)


@units
def unit_file_reloaded(case, facts, audit):
    """`UNIT: NeedDaemonReload` — whether systemd runs the unit file on disk (`no`: no daemon-reload pending).

    Modes: spec, profile.
    """
    unit = case.item
    loaded(audit, unit, facts, f"{unit['name']}: NeedDaemonReload", "no")
    audit.expect(f"{unit['name']}: NeedDaemonReload", "no", facts.units[unit["name"]].shown.get("NeedDaemonReload"))


@per_unit("properties")
def property(case, facts, audit):
    """`UNIT: SETTING` — a [Service] setting as `systemctl show` reports it, against the rendered unit or the rule.

    Modes: spec, profile.
    """
    unit, name, expected = case.item
    check = f"{unit['name']}: {name}"
    loaded(audit, unit, facts, check, expected)
    actual = facts.units[unit["name"]].shown.get(name) or UNSET
    audit.expect(check, expected, actual + from_dropin(unit, facts, UNIT_KEYS.get(name, name)),
                 passed=matches(expected, actual))


@per_unit("environment")
def environment(case, facts, audit):
    """`UNIT: Environment NAME` — a variable of the unit's environment against the rendered unit or the rule.

    Modes: spec, profile.

    A secret's value (an API key, a token) is compared, never shown. A drop-in that sets the variable
    is named: `1 (from /etc/systemd/system/UNIT.d/override.conf)`.
    """
    unit, name, expected = case.item
    check = f"{unit['name']}: Environment {name}"
    secret = is_secret_name(name)
    loaded(audit, unit, facts, check, expected if isinstance(expected, dict) or not secret else REDACTED)
    actual = facts.units[unit["name"]].environment.get(name, UNSET)
    source = from_dropin(unit, facts, f"Environment {name}")
    passed = matches(expected, actual)
    if secret:  # compared, never shown
        shown_actual = actual if actual == UNSET else REDACTED if passed else f"{REDACTED} (another value)"
        audit.expect(check, expected if isinstance(expected, dict) else REDACTED, shown_actual + source, passed=passed)
    else:
        audit.expect(check, expected, actual + source, passed=passed)


@units
def command_line(case, facts, audit):
    """`UNIT: ExecStart` — the command line as systemd runs it, against the rendered unit (spec) or the profile's rule.

    Modes: spec, profile.
    """
    unit = case.item
    loaded(audit, unit, facts, f"{unit['name']}: ExecStart", unit["command_line"])
    actual = shown_command(facts.units[unit["name"]].argv)
    audit.expect(f"{unit['name']}: ExecStart", unit["command_line"], (actual or UNSET) + from_dropin(unit, facts, "ExecStart"),
                 passed=matches(unit["command_line"], actual))


@units
def dropins_applied(case, facts, audit):
    """`UNIT: drop-ins` — every drop-in systemd applies to the unit (`systemctl show -p DropInPaths`) and what it sets, against none that change a managed setting.

    Modes: spec, profile.

    A managed setting is a key the rendered unit sets (any section), one of its Environment variables, or
    ExecStart; an empty assignment (`Environment=`, `ExecStart=`) resets a list and changes it too. Drop-ins
    that change only other settings are listed and pass; profile mode reports every drop-in.
    """
    unit = case.item
    check = f"{unit['name']}: drop-ins"
    expected = NO_MANAGED_DROPINS if unit.get("managed") is not None else REPORTED
    loaded(audit, unit, facts, check, expected)
    found = unit_dropins(unit, facts)
    described = []
    for path, changes in found:
        managed = dropins.changes_managed(changes)
        others = [change for change in changes if not change["managed"]]
        text = f"{path} {dropins.describe(managed)}" if managed else f"{path} {dropins.describe(changes)}"
        if managed and others:
            text += f" (and {dropins.describe(others)})"
        elif not managed and unit.get("managed") is not None:
            text += " (not managed)"
        described.append(text)
    audit.expect(check, expected, "; ".join(described) or "none",
                 passed=not any(dropins.changes_managed(changes) for _, changes in found))


def units_with(key: str):
    """The check runs once per unit whose expectations have `key` (spec mode: env_file, config_file)."""
    return each(lambda expected: [unit for unit in expected["units"] if unit.get(key)], ids=lambda unit: unit["name"])


env_files = units_with("env_file")


@env_files
def env_file_mode(case, facts, audit):
    """`UNIT: EnvironmentFile mode` — the env file's mode against the one the role sets.

    Modes: spec.
    """
    unit = case.item
    loaded(audit, unit, facts, f"{unit['name']}: EnvironmentFile mode", unit["env_file"]["mode"])
    expect_env_file_mode(audit, f"{unit['name']}: EnvironmentFile", unit["env_file"], facts.units[unit["name"]].env_file)


@env_files
def env_file_owner(case, facts, audit):
    """`UNIT: EnvironmentFile owner` — the env file's owner:group against the one the role sets.

    Modes: spec.
    """
    unit = case.item
    loaded(audit, unit, facts, f"{unit['name']}: EnvironmentFile owner", unit["env_file"]["owner"])
    expect_env_file_owner(audit, f"{unit['name']}: EnvironmentFile", unit["env_file"], facts.units[unit["name"]].env_file)


@env_files
def env_file_content(case, facts, audit):
    """`UNIT: EnvironmentFile content` — the env file's sha256 against the file rendered with the real key (never shown).

    Modes: spec.
    """
    unit = case.item
    loaded(audit, unit, facts, f"{unit['name']}: EnvironmentFile content",
           f"as rendered (sha256 {unit['env_file']['sha256'][:12]})")
    expect_env_file_content(audit, f"{unit['name']}: EnvironmentFile", unit["env_file"],
                            facts.units[unit["name"]].env_file_sha256)


config_files = units_with("config_file")


@config_files
def config_file(case, facts, audit):
    """`UNIT: config file PATH` — the `vllm serve --config` file against the rendered one (the first differing line).

    Modes: spec.
    """
    unit = case.item
    loaded(audit, unit, facts, f"{unit['name']}: config file {unit['config_file']['path']}",
           f"as rendered ({len(unit['config_file']['content'].splitlines())} lines)")
    expect_config_file(audit, unit["name"], unit["config_file"], facts.units[unit["name"]].config_text)


@serving
def listening(case, facts, audit):
    """`UNIT: listening` — the addresses listening on the server's port (the host's TCP tables, /proc/net/tcp and tcp6) against its bind address.

    Modes: spec, profile.

    Addresses are written as ss writes them (`0.0.0.0:8000`, `[::]:8000`); tables that could not be read make
    the row an error that says so, never `nothing on port`.
    """
    unit = case.item
    loaded(audit, unit, facts, f"{unit['name']}: listening", unit["listen"])
    port = unit["listen"].rsplit(":", 1)[1]
    on_port = listening_on(audit, facts, f"{unit['name']}: listening", unit["listen"], port)
    audit.expect(f"{unit['name']}: listening", unit["listen"], on_port or f"nothing on port {port}",
                 passed=unit["listen"] in on_port)


@serving
def health(case, facts, audit):
    """`UNIT: GET URL/health` — the HTTP status of the server's /health, asked on the host itself, against 200.

    Modes: spec, profile.

    URL is where the host itself reaches the server (`http://127.0.0.1:8000` for one bound to every address),
    as in the containers' `CONTAINER: GET URL/health`.
    """
    unit = case.item
    check = f"{unit['name']}: GET {unit['url']}/health"
    loaded(audit, unit, facts, check, "200")
    answer = facts.units[unit["name"]].http.get("/health", {"error": "no answer"})
    audit.expect(check, "200", answer.get("status", answer.get("error")))


@serving
def served_models(case, facts, audit):
    """`UNIT: GET URL/v1/models` — the model ids the server lists against its served names, and the key it was asked with.

    Modes: spec, profile.

    Spec mode asks with the key the spec declares (its api_key_file, read on the controller and sent on the
    ssh session's stdin; none declared: no key), never the server's own: a server that refuses it fails
    `HTTP 401: refuses the spec's API key (the spec's api_key_file)`. Profile mode has no spec: it asks with the
    server's own key and says where it came from (`key: VLLM_API_KEY of pid N`, `the api-key option on the command
    line of pid N`).
    """
    unit = case.item
    check = f"{unit['name']}: GET {unit['url']}/v1/models"
    loaded(audit, unit, facts, check, unit["served_names"])
    http = facts.units[unit["name"]].http
    answer = http.get("/v1/models", {"error": "no answer"})
    found, source = model_ids(answer), spec_key_source(unit) or http.get("key", "not said")
    if answer.get("status") == 401 and "api_key" in unit:
        found = f"HTTP 401: refuses the spec's API key ({source})"
    audit.expect(check, unit["served_names"], f"{shown(found)} (key: {source})", passed=found == unit["served_names"])


def spec_key_source(unit: dict) -> str | None:
    """Spec mode: where the key the probe used came from; None: profile mode (the probe says)."""
    if "api_key" not in unit:
        return None
    return "the spec's api_key_file" if unit["api_key"]["file"] else "none: the spec declares no API key"


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


@serving
def ready(case, facts, audit):
    """`UNIT: ready (one request served)` — the unit's own readiness probe's verdict against `ready`.

    Modes: spec, profile.

    The units' own readiness probe, once: /health, then one real request (a 1-token completion,
    one embedding or one rerank, whichever the model serves) with the server's API key."""
    unit = case.item
    loaded(audit, unit, facts, f"{unit['name']}: ready (one request served)", "ready")
    ready = facts.units[unit["name"]].ready
    lines = (ready.text.strip().splitlines() or ["no output"]) if ready else ["not probed"]
    verdict = lines[-1].removeprefix("wait-ready: ")
    audit.expect(f"{unit['name']}: ready (one request served)", "ready", verdict,
                 passed=ready is not None and ready.rc == 0)


@nodes
def group(case, facts, audit):
    """`UNIT: node R of N, rendezvous ADDRESS:PORT` — rank 0 listening on the rendezvous port, a headless node connected to it.

    Modes: spec.

    Node rank 0: something listens on the rendezvous port; a headless node (rank ≥ 1): a connection established
    to the leader's rendezvous (the host's TCP tables); the rank, size and master address are those its config file
    gives.
    Every node's unit, config file (rank, size, master address and port) and vLLM version are checked against
    the spec on its own host, which makes them agree; this row says the group met: the followers stay
    connected to the leader's store (torch.distributed's TCPStore, which vLLM's launcher runs on node rank 0),
    and node rank 0's `ready` row says the whole group serves."""
    unit = case.item
    group = unit["group"]
    master = f"{bracketed(group['master_addr'])}:{group['master_port']}"
    check = f"{unit['name']}: node {group['rank']} of {group['size']}, rendezvous {master}"
    if group["rank"] == 0:
        loaded(audit, unit, facts, check, f"listening on port {group['master_port']}")
        on_port = listening_on(audit, facts, check, f"listening on port {group['master_port']}", group["master_port"])
        audit.expect(check, f"listening on port {group['master_port']}",
                     f"listening on {', '.join(on_port)}" if on_port else f"nothing on port {group['master_port']}",
                     passed=bool(on_port))
        return
    loaded(audit, unit, facts, check, f"connected to {master}")
    peers = sorted({peer for _, peer in connected(audit, facts, check, f"connected to {master}") if joins(peer, group)})
    audit.expect(check, f"connected to {master}", f"connected to {', '.join(peers)}" if peers else
                 f"no connection to {master}", passed=bool(peers))


def joins(peer: str, group: dict) -> bool:
    """Whether an established connection's peer is the group's rendezvous (a master address given as a name:
    its port alone tells)."""
    address, _, port = peer.rpartition(":")
    if port != str(group["master_port"]):
        return False
    address = address.strip("[]").removeprefix("::ffff:")
    try:
        ipaddress.ip_address(group["master_addr"])
    except ValueError:
        return True
    return address == group["master_addr"]


started = units_with("started_from")  # spec mode: the units whose running process is compared with their files
hosts_running = each(lambda expected: [expected] if expected.get("running") else [], ids=lambda _: "strays")
STRAYS = "vLLM servers and GPU processes not in the spec"


def scanned(audit, facts, check: str, expected) -> dict:
    """The process scan; the row is unknown where it could not be read (no python3 on the host…)."""
    if facts.processes is None:
        audit.unknown(check, expected, f"the processes not read: {facts.processes_problem}")
    return facts.processes


def unit_server(unit: dict, facts) -> dict | None:
    """The running server of a spec unit (its MainPID's), or None."""
    main_pid = int(facts.units[unit["name"]].shown.get("MainPID") or 0)
    return running.server_of(facts.processes, main_pid)


@started
def restart_pending(case, facts, audit):
    """`UNIT: restart pending` — the unit's running process against its files: none of its unit file, env file, config file, program (`bin/vllm`) or the venv link it runs through changed after the process started.

    Modes: spec.

    A file changed since (`restart pending: /etc/vllm/chat.yaml (changed TIME), after pid N started TIME`) means
    the server does not run what the files say: `systemctl restart UNIT` (or `provision apply`) starts it anew.
    """
    unit = case.item
    check = f"{unit['name']}: restart pending"
    loaded(audit, unit, facts, check, running.NO_RESTART_PENDING)
    scan = scanned(audit, facts, check, running.NO_RESTART_PENDING)
    passed, actual = running.unit_restart(unit_server(unit, facts), unit["started_from"], scan)
    if passed is None:
        audit.unknown(check, running.NO_RESTART_PENDING, actual)
    audit.expect(check, running.NO_RESTART_PENDING, actual, passed=passed)


@started
def running_vllm(case, facts, audit):
    """`UNIT: vLLM running` — the vLLM version the unit's process imported (its maps: vLLM's shared objects and the dist-info beside them; else its API's /version) against the spec's `vllm.version`.

    Modes: spec.

    The venv's version row says what is installed; this one what runs: an upgrade not yet restarted into, or a
    venv replaced under the server (`0.25.0 (deleted)`), shows here.
    """
    unit = case.item
    check = f"{unit['name']}: vLLM running"
    loaded(audit, unit, facts, check, unit["vllm_version"])
    scanned(audit, facts, check, unit["vllm_version"])
    server = unit_server(unit, facts)
    if server is None:
        audit.expect(check, unit["vllm_version"], "no running server", passed=False)
    version, source = running.running_version(server)
    actual = f"{version or 'unknown'} (pid {server['pid']}, {source})"
    if version is None and (server.get("imported") or {}).get("problem"):  # its maps not read, no API answer
        audit.unknown(check, unit["vllm_version"], actual)
    audit.expect(check, unit["vllm_version"], actual, passed=version == unit["vllm_version"])


@hosts_running
def strays(case, facts, audit):
    """`vLLM servers and GPU processes not in the spec` — every vLLM server running on the host (found by its command line, its maps or its API, whatever started it) that is none of the spec's units and containers, and every GPU process in no vLLM server's tree, against none.

    Modes: spec.

    Each is named with how it was started: `stray vLLM server: pid 1234 on 0.0.0.0:8002, started by root's
    crontab (@reboot), no API key`; `stray GPU process: pid 42 (python3) holds 1024 MiB on GPU-…`. What could
    not be read (the GPU processes, a process's open files) makes the row an error that lists what was found.
    """
    scan = scanned(audit, facts, STRAYS, running.NO_STRAYS)
    unit_pids = {unit["name"]: int(facts.units[unit["name"]].shown.get("MainPID") or 0) for unit in case.item["units"]}
    container_ids = [(found.inspect or {}).get("Id", "") for found in facts.containers.values()]
    found = running.strays(scan, unit_pids, container_ids, facts.compute_apps or [],
                           lambda server: supervision(server["cgroup"]), keyed)
    unread = scan.get("problems", []) + (
        [f"GPU processes not read ({facts.compute_apps_problem})"] if facts.compute_apps_problem else [])
    if unread:
        audit.unknown(STRAYS, running.NO_STRAYS, "; ".join([*found, *unread]))
    audit.expect(STRAYS, running.NO_STRAYS, found or "none", passed=not found)


def keyed(server: dict) -> bool:
    """Whether a server asks for an API key (its command line, its --config file or its environment)."""
    return running.has_api_key(server, {**config_options(parsed_config(server.get("config"))),
                                        **command_options(server["cmdline"])})
