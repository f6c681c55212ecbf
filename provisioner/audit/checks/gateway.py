"""Role gateway's HAProxy: `haproxy.service` enabled and active, as the role's systemd_service task leaves it.

Spec mode, on the hosts that run a gateway (the inventory's group `gateway`). Its configuration,
/etc/haproxy/haproxy.cfg, is a `file PATH` row (managed_files.py): compared with the role's own
template rendered with the real API keys, the differing line shown redacted.
"""

import shlex

from provisioner.audit.engine import json_answer, shown_properties
from provisioner.audit.registry import UNSET, each
from provisioner.base.paths import module_utils_file

# HAProxy's routes and the drains vllm-provision recorded, read on the gateway host by the modules' own code
HAPROXY_READER = module_utils_file("haproxy_runtime")


def commands(expected):
    if not expected.get("gateway"):
        return {}
    gateway = expected["gateway"]
    return {
        "gateway": f"systemctl show {shlex.quote(gateway['name'])} --property=LoadState,UnitFileState,ActiveState",
        "gateway_routes": shlex.join(["python3", "-c", HAPROXY_READER.read_text(), "read", gateway["record_dir"],
                                      gateway["socket"]]),
    }


def read(expected, out):
    """`systemctl show` of haproxy.service, and HAPROXY_READER's answer: {backends: {backend: {server: state}},
    records: {BACKEND/SERVER: record}} or {error} (both None where no gateway is expected)."""
    if "gateway" not in out:
        return {"gateway": None, "gateway_routes": None}
    answer, problem = json_answer(out["gateway_routes"], dict)
    return {"gateway": shown_properties(out["gateway"]),
            "gateway_routes": answer if answer is not None else {"error": problem}}

gateway = each(lambda expected: [expected["gateway"]] if expected.get("gateway") else [], ids=lambda unit: unit["name"])


@gateway
def gateway_enabled(case, facts, audit):
    """`haproxy.service: enabled` — the unit file state (`systemctl show UnitFileState`) against the one the role sets: a disabled gateway is gone after the next boot.

    Modes: spec.
    """
    unit, shown = case.item, facts.gateway or {}
    check = f"{unit['name']}: enabled"
    if shown.get("LoadState") != "loaded":
        audit.expect(check, unit["enabled"], f"not installed ({shown.get('LoadState') or 'unknown to systemd'})",
                     passed=False)
    audit.expect(check, unit["enabled"], shown.get("UnitFileState") or UNSET)


@gateway
def gateway_active(case, facts, audit):
    """`haproxy.service: active` — the service's state (`systemctl show ActiveState`): without it no client reaches any route.

    Modes: spec.
    """
    unit, shown = case.item, facts.gateway or {}
    audit.expect(f"{unit['name']}: active", unit["active"], shown.get("ActiveState") or UNSET)


replicas = each(lambda expected: (expected.get("gateway") or {}).get("servers") or [],
                ids=lambda server: f"{server['backend']}-{server['server']}")


def gateway_view(state: dict, record: dict | None) -> str:
    """What HAProxy does with a replica, in a few words: `ready, UP`; `drain (by vllm-provision: rollout: gpu1
    changes), UP`; `maint (not by vllm-provision), MAINT`; `ready, DOWN (L4CON: Connection refused)`."""
    from provisioner.base.module_utils import haproxy_runtime

    admin = state["admin"]
    if admin != "ready":
        admin += f" (by vllm-provision: {record.get('reason', '')})" if record else " (not by vllm-provision)"
    # the check's words where it fails (DRAIN and MAINT say the admin state, not the health)
    healthy = haproxy_runtime.is_up(state) or state["status"] in ("DRAIN", "MAINT")
    status = state["status"] if healthy else f"{state['status']} ({haproxy_runtime.last_check(state)})"
    return f"{admin}, {status}" + (", weight 0" if state["weight"] == 0 else "")


@replicas
def gateway_replica_in_rotation(case, facts, audit):
    """`gateway BACKEND/SERVER (MODEL)` — the gateway's view of each replica of each route (HAProxy's `show stat` and `show servers state` on its admin socket, and the drains vllm-provision recorded) against `ready, UP`: a replica drained (by a rollout that failed or was interrupted, or by an operator), in maintenance or failing its health check serves no client.

    Modes: spec.
    """
    server = case.item
    name = f"{server['backend']}/{server['server']}"
    check = f"gateway {name} ({server['model']})"
    routes = facts.gateway_routes or {"error": "not read"}
    if "error" in routes:
        audit.expect(check, "ready, UP", f"unknown: {routes['error']}", passed=False)
    state = routes["backends"].get(server["backend"], {}).get(server["server"])
    if state is None:
        audit.expect(check, "ready, UP", "not in the running haproxy (reload it: provision apply)", passed=False)
    audit.expect(check, "ready, UP", gateway_view(state, routes["records"].get(name)))
