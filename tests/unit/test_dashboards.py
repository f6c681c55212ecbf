"""The Grafana dashboards (provisioner/fleet/dashboards.py): their structure, every PromQL expression parsed by the real
promtool (as a recording rule), and every metric name one that the pinned vLLM really exports (the H200
recording), that the GPU timer writes (its script run against the TEST DOUBLE nvidia-smi) or that docs/monitoring.md
lists from node_exporter. (The lab runs every expression against a real Prometheus: tests/integration/test_monitoring.py.)"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from provisioner.fleet.dashboards import dashboard_files, dashboards, expressions, with_variables
from tests.unit.test_monitoring import promtool
from tests.unit.test_standin_metrics import RECORDED, families

REPO = Path(__file__).resolve().parents[2]
METRIC_RE = re.compile(r"\b(vllm:[a-z0-9_:]+|nvsmi_[a-z_]+|node_[A-Za-z_]+)")


def test_each_dashboard_is_grafana_json_with_unique_ids_and_queries():
    boards = dashboards()
    assert sorted(boards) == ["dashboards/vllm-provision-fleet.json", "dashboards/vllm-provision-instance.json"]
    for name, board in boards.items():
        assert json.loads(dashboard_files()[name]) == board
        assert name == f"dashboards/{board['uid']}.json" and board["title"].endswith("(vllm-provision)")
        ids = [panel["id"] for panel in board["panels"]]
        assert ids == list(range(1, len(ids) + 1))
        cells = [(panel["gridPos"]["x"], panel["gridPos"]["y"]) for panel in board["panels"]]
        assert len(set(cells)) == len(cells), f"{name}: panels overlap"
        for panel in board["panels"]:
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert [target["refId"] for target in panel["targets"]] == [chr(65 + i) for i in range(len(panel["targets"]))]
            assert all(target["expr"] and target["legendFormat"] for target in panel["targets"]), panel["title"]
        assert [variable["name"] for variable in board["templating"]["list"]][0] == "datasource"
    assert [variable["name"] for variable in boards["dashboards/vllm-provision-instance.json"]["templating"]["list"]] \
        == ["datasource", "instance", "host"]


def test_every_expression_parses_with_promtool(tmp_path):
    exprs = [with_variables(expr, "qwen-a", "gpu1") for board in dashboards().values() for _, expr in expressions(board)]
    assert len(exprs) == 40
    rules = {"groups": [{"name": "dashboards", "rules": [{"record": f"dashboard:expr_{index}", "expr": expr}
                                                         for index, expr in enumerate(exprs)]}]}
    (tmp_path / "dashboards.yml").write_text(yaml.safe_dump(rules))
    checked = promtool("check", "rules", "dashboards.yml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in checked.stdout


@pytest.fixture(scope="module")
def textfile_metrics(tmp_path_factory) -> set[str]:
    """The names the GPU timer's script writes, run here against the TEST DOUBLE nvidia-smi (an RTX 3090)."""
    folder = tmp_path_factory.mktemp("nvsmi")
    env = {**os.environ, "NVIDIA_SMI_STANDIN_FIXTURE": str(REPO / "tests/fixtures/gpu/rtx3090"),
           "NVIDIA_SMI_STANDIN_STATE": str(folder / "state.json"), "NVIDIA_SMI_STANDIN_LOG": str(folder / "calls.jsonl")}
    subprocess.run([sys.executable, REPO / "roles/node_exporter/files/nvsmi-textfile", "--nvidia-smi",
                    REPO / "tests/doubles/nvidia_smi_standin.py", folder], env=env, check=True)
    return set(families((folder / "nvsmi.prom").read_text()))


def test_every_metric_is_one_the_sources_really_write(textfile_metrics):
    recorded = set(families((RECORDED / "metrics-under-load.txt").read_text()))
    documented = (REPO / "docs" / "monitoring.md").read_text()
    used = {name for board in dashboards().values() for _, expr in expressions(board) for name in METRIC_RE.findall(expr)}
    vllm = {re.sub(r"_(bucket|count|sum)$", "", name) for name in used if name.startswith("vllm:")}
    assert sorted(vllm - recorded) == []
    assert sorted(name for name in used if name.startswith("nvsmi_") and name not in textfile_metrics) == []
    assert sorted(name for name in used if f"`{name}`" not in documented
                  and not any(f"`{family}`" in documented for family in vllm if name.startswith(family))) == []
    assert len(vllm) == 12 and len([name for name in used if name.startswith("node_")]) == 5
