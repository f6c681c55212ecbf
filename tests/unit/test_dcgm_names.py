"""Every dcgm-exporter metric name this project names (docs/monitoring.md, the dashboards, the alert rules) is
one of dcgm-exporter's default counters file (a copy: tests/fixtures/monitoring/dcgm-exporter/, its source
commit in its README); one that the file has commented out is said so where the docs name it."""

from __future__ import annotations

import json
import re
from pathlib import Path

from provisioner.fleet import monitoring
from provisioner.fleet.dashboards import dashboards
from provisioner.spec import load_spec

REPO = Path(__file__).resolve().parents[2]
COUNTERS = REPO / "tests/fixtures/monitoring/dcgm-exporter/default-counters.csv"
DOCS = REPO / "docs/monitoring.md"
SPEC = REPO / "tests/fixtures/monitoring/spec.yml"
DCGM_NAME = re.compile(r"\bDCGM_(?:FI|EXP)_[A-Z0-9_]+")


def counters() -> dict[str, bool]:
    """Each field of the file → whether the exporter exports it by default (its line not commented out)."""
    found = {}
    for line in COUNTERS.read_text().splitlines():
        enabled = not line.startswith("#")
        field = line.lstrip("# ").split(",", 1)[0].strip()
        if DCGM_NAME.fullmatch(field) and "," in line:
            found[field] = enabled
    return found


def test_the_copy_is_nvidia_s_file():
    assert len(counters()) == 61 and sum(counters().values()) == 26
    assert counters()["DCGM_FI_DEV_XID_ERRORS"] is True
    assert "DCGM_FI_DEV_XID_ERRORS,              gauge,   Value of the last XID error encountered." in \
        COUNTERS.read_text().splitlines()


def test_every_dcgm_name_we_use_is_a_default_counter_or_said_to_be_off():
    known = counters()
    docs = DOCS.read_text()
    rules = json.dumps(monitoring.alert_rules(load_spec(SPEC)))
    boards = json.dumps(dashboards())
    used = set(DCGM_NAME.findall(docs)) | set(DCGM_NAME.findall(rules)) | set(DCGM_NAME.findall(boards))
    assert sorted(name for name in used if name not in known) == []
    off = {name for name in used if not known[name]}
    assert sorted(name for name in off if not all("not in the default counters" in line
                                                  for line in docs.splitlines() if name in line)) == []
    assert not DCGM_NAME.findall(rules) and not DCGM_NAME.findall(boards)
    assert len(used) == 10
