"""nvidia-smi's CSV queries and topology matrices, on real H200 output and the constructed consumer cards."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from provisioner.gpu.nvml import ReplayNvml, read_nvml_facts
from provisioner.gpu.smi import (
    QUERY_FIELDS,
    SmiError,
    fact_commands,
    parse_query_csv,
    parse_topology_matrix,
    query_arguments,
    read_smi_facts,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gpu"
# what does not move between two readings a few seconds apart
STEADY = ("index", "uuid", "name", "pci_bus_id", "memory_total_mib", "power_limit_w", "power_default_w", "power_min_w",
          "power_max_w", "power_enforced_w", "persistence_mode", "pcie_gen_current", "pcie_gen_max",
          "pcie_width_current", "pcie_width_max", "clock_sm_max_mhz", "clock_memory_max_mhz", "performance_state",
          "throttle_reasons")


def read(*parts: str) -> str:
    return (FIXTURES.joinpath(*parts)).read_text()


def test_the_modules_own_query_on_a_real_h200_agrees_with_nvml_read_the_same_minute():
    (csv_gpu,), driver = parse_query_csv(read("h200x1", "query-gpu.csv"))
    (nvml_gpu,) = read_nvml_facts(ReplayNvml.from_file(FIXTURES / "h200x1" / "nvml.json"))["gpus"]

    assert driver == "580.159.04"
    assert {key: csv_gpu[key] for key in STEADY} == {key: nvml_gpu[key] for key in STEADY}
    assert csv_gpu["power_limit_w"] == 700.0 and csv_gpu["throttle_reasons"] == ["gpu_idle"]


def test_any_subset_of_fields_reads_by_the_header_and_the_rest_is_none():
    gpus, driver = parse_query_csv(read("h200x2", "query-gpu.csv"))  # recorded with other fields and names
    assert driver == "580.159.04"
    assert [(gpu["index"], gpu["power_max_w"], gpu["clock_sm_mhz"], gpu["persistence_mode"]) for gpu in gpus] == [
        (0, 700.0, 405, True), (1, 700.0, 375, True)]
    assert gpus[0]["performance_state"] is None and gpus[0]["throttle_reasons"] is None

    events, _ = parse_query_csv(read("h200x2", "query-gpu-events.csv"))  # "clocks_event_reasons.active" in the header
    assert [gpu["throttle_reasons"] for gpu in events] == [["gpu_idle"], ["gpu_idle"]]


def test_not_available_cells_are_none_and_broken_rows_are_errors():
    (gpu,), _ = parse_query_csv("index, power.draw [W], pstate\n0, [N/A], [Not Supported]\n")
    assert (gpu["index"], gpu["power_draw_w"], gpu["performance_state"]) == (0, None, None)
    with pytest.raises(SmiError, match="columns"):
        parse_query_csv("index, power.draw [W]\n0\n")
    with pytest.raises(SmiError, match="no CSV header"):
        parse_query_csv("\n")


def test_every_field_we_ask_for_exists_in_the_real_drivers_help():
    known = set(re.findall(r'^"([^"]+)"', read("h200x2", "help-query-gpu.txt"), re.MULTILINE))
    known |= {alias for line in read("h200x2", "help-query-gpu.txt").splitlines()
              for alias in re.findall(r'or "([^"]+)"', line)}
    asked = query_arguments()[0].removeprefix("--query-gpu=").split(",")
    assert len(asked) == len(QUERY_FIELDS) + 1
    assert [field for field in asked if field not in known] == []


def test_topology_matrices():
    assert parse_topology_matrix(read("h200x2", "topo-m.txt")) == {(0, 1): "NV18", (1, 0): "NV18"}  # with ANSI codes
    assert parse_topology_matrix(read("rtx4090x2", "topo-m.txt")) == {(0, 1): "PHB", (1, 0): "PHB"}
    assert parse_topology_matrix(read("rtx4090x2", "topo-p2p-r.txt")) == {(0, 1): "GNS", (1, 0): "GNS"}


def fake_nvidia_smi(machine: str):
    answers = {
        " ".join(query_arguments()): read(machine, "query-gpu.csv"),
        "topo -m": read(machine, "topo-m.txt"),
        "topo -p2p r": read(machine, "topo-p2p-r.txt"),
        "topo -p2p w": read(machine, "topo-p2p-w.txt"),
    }
    return lambda arguments: answers[" ".join(arguments)]


def test_nvidia_smi_and_nvml_give_the_same_facts_of_the_constructed_4090_pair():
    from_smi = read_smi_facts(fake_nvidia_smi("rtx4090x2"))
    from_nvml = read_nvml_facts(ReplayNvml.from_file(FIXTURES / "rtx4090x2" / "nvml.json"))

    assert from_smi["source"] == "nvidia-smi" and from_smi["cuda_version"] is None  # --query-gpu does not tell it
    assert from_smi["gpus"] == from_nvml["gpus"]
    assert from_smi["links"] == [{"gpus": [0, 1], "pcie_path": "PHB", "nvlink": False,
                                  "p2p_read": "gpu_not_supported", "p2p_write": "gpu_not_supported"}]
    assert from_nvml["links"][0]["p2p_read"] == "gpu_not_supported"


def test_a_topology_nvidia_smi_cannot_tell_leaves_the_links_unknown():
    answers = fake_nvidia_smi("rtx4090x2")

    def run(arguments):
        if arguments[0] == "topo":
            raise SmiError("topology not available")
        return answers(arguments)

    assert read_smi_facts(run)["links"] == [
        {"gpus": [0, 1], "pcie_path": None, "nvlink": None, "p2p_read": None, "p2p_write": None}]


def test_fact_commands_are_every_command_the_facts_need_so_they_can_run_in_one_batch():
    answers, asked = fake_nvidia_smi("rtx4090x2"), []
    read_smi_facts(lambda arguments: asked.append(arguments) or answers(arguments))
    assert asked == fact_commands()
