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
