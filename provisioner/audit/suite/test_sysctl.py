"""Kernel parameters (role sysctl): as configured, and live where the host has a kernel of its own.

Spec mode reads our drop-in (`sysctl_file`); profile mode reads what systemd-sysctl applies at boot
(`systemd-analyze cat-config sysctl.d`, the last setting of a key wins).
"""

from provisioner.audit.checks import ABSENT, each

settings = each(lambda expected: expected["sysctl"]["settings"].items(), ids=lambda setting: setting[0])


@settings
def test_configured(case, facts, audit):
    key, value = case.item
    where = "file" if case.target["sysctl"]["file"] else "configured"
    audit.expect(f"sysctl {where}: {key}", value, facts.sysctl_configured.get(key, ABSENT))


@settings
def test_live(case, facts, audit):
    key, value = case.item
    check = f"sysctl live: {key}"
    if facts.container:
        audit.not_applicable(check, value, f"a container ({facts.container}) shares its host's kernel")
    audit.expect(check, value, facts.sysctl_live[key] or ABSENT)
