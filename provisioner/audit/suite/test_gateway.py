"""Role gateway's HAProxy: `haproxy.service` enabled and active, as the role's systemd_service task leaves it.

Spec mode, on the hosts that run a gateway (the inventory's group `gateway`). Its configuration,
/etc/haproxy/haproxy.cfg, is a `file PATH` row (test_managed_files.py): compared with the role's own
template rendered with the real API keys, the differing line shown redacted.
"""

from provisioner.audit.checks import UNSET, each

gateway = each(lambda expected: [expected["gateway"]] if expected.get("gateway") else [], ids=lambda unit: unit["name"])


@gateway
def test_gateway_enabled(case, facts, audit):
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
def test_gateway_active(case, facts, audit):
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
def test_gateway_replica_in_rotation(case, facts, audit):
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
