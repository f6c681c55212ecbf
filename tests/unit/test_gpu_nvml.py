"""The NVML seam on recorded answers (real H200s) and constructed ones (consumer cards), and the live backend's calls."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from provisioner.base.module_utils import gpu_facts
from provisioner.gpu.facts import facts_from_data, read_facts
from provisioner.gpu.nvml import LiveNvml, NvmlCallError, NvmlUnavailable, ReplayNvml, read_nvml_facts

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gpu"


def test_recorded_h200_pair_reads_as_recorded():
    facts = read_facts(recording=FIXTURES / "h200x2" / "nvml.json")

    assert (facts.source, facts.driver_version, facts.cuda_version) == ("nvml", "580.159.04", "13.0")
    assert [gpu.uuid for gpu in facts.gpus] == ["GPU-4b0b4056-7044-6b7c-5c07-ac8934fd439c",
                                               "GPU-4ed1b63a-860c-33c9-6d01-6521be953689"]
    gpu = facts.gpu(1)
    assert (gpu.name, gpu.pci_bus_id, gpu.memory_total_mib) == ("NVIDIA H200", "00000000:00:07.0", 143771)
    assert (gpu.power_limit_w, gpu.power_default_w, gpu.power_min_w, gpu.power_max_w, gpu.power_enforced_w) == (
        700.0, 700.0, 200.0, 700.0, 700.0)
    assert gpu.power_draw_w == 76.33
    assert gpu.persistence_mode is True
    assert (gpu.pcie_gen_current, gpu.pcie_gen_max, gpu.pcie_width_current, gpu.pcie_width_max) == (5, 5, 16, 16)
    assert (gpu.clock_sm_mhz, gpu.clock_sm_max_mhz, gpu.clock_memory_max_mhz) == (345, 1980, 3201)
    assert (gpu.performance_state, gpu.throttle_reasons) == ("P0", ("gpu_idle",))
    (link,) = facts.links
    # NVML's PCIe ancestor says PHB although the two talk over NVLink: P2P is judged from the P2P status
    assert (link.gpus, link.pcie_path, link.nvlink, link.p2p_read, link.p2p_write) == ((0, 1), "PHB", True, "ok", "ok")
    assert link.p2p is True


def test_replay_asks_only_what_the_recorder_recorded():
    for machine in ("h200x2", "h200x1", "rtx3090", "rtx4070", "rtx4090x2"):
        nvml = ReplayNvml.from_file(FIXTURES / machine / "nvml.json")
        read_nvml_facts(nvml)
        missing = [key for key in nvml.asked if key not in nvml.recording["calls"]]
        assert missing == [], machine


def test_constructed_4090_pair_is_seed_3():
    facts = read_facts(recording=FIXTURES / "rtx4090x2" / "nvml.json")

    assert [(gpu.power_limit_w, gpu.power_default_w, gpu.power_min_w, gpu.power_max_w) for gpu in facts.gpus] == [
        (300.0, 450.0, 150.0, 450.0)] * 2
    assert [gpu.persistence_mode for gpu in facts.gpus] == [False, False]
    (link,) = facts.links
    assert (link.pcie_path, link.nvlink, link.p2p_read, link.p2p) == ("PHB", False, "gpu_not_supported", False)


def test_an_nvml_error_or_a_missing_answer_is_none_not_a_crash():
    recording = ReplayNvml.from_file(FIXTURES / "h200x1" / "nvml.json").recording
    recording["calls"]["nvmlDeviceGetPowerUsage(0)"] = {"error": "Not Supported", "code": 3}
    del recording["calls"]["nvmlDeviceGetCurrentClocksEventReasons(0)"]
    recording["calls"]["nvmlDeviceGetCurrentClocksThrottleReasons(0)"] = {"value": 4}  # drivers before the rename

    (gpu,) = facts_from_data(read_nvml_facts(ReplayNvml(recording))).gpus

    assert gpu.power_draw_w is None
    assert gpu.throttle_reasons == ("sw_power_cap",)
    with pytest.raises(NvmlCallError, match="not recorded"):
        ReplayNvml(recording).call("nvmlDeviceGetSerial", "7")


def test_reason_names_and_cuda_version():
    assert gpu_facts.reason_names(0) == []
    assert gpu_facts.reason_names(0x1 | 0x4 | 0x40) == ["gpu_idle", "sw_power_cap", "hw_thermal_slowdown"]
    assert gpu_facts.reason_names(0x1000) == ["other_0x1000"]
    assert gpu_facts._cuda_version(12040) == "12.4"


class FakePynvml(types.ModuleType):
    """Just enough pynvml to see what LiveNvml passes to it."""

    class NVMLError(Exception):
        pass

    class Struct:
        _fields_ = [("total", int), ("used", int)]

        def __init__(self):
            self.total, self.used = 2 * 1024**3, 1024**2

    def __init__(self, fail_init: bool = False):
        super().__init__("pynvml")
        self.fail_init, self.calls = fail_init, []

    def nvmlInit(self):
        if self.fail_init:
            raise self.NVMLError("Driver Not Loaded")

    def nvmlShutdown(self):
        self.calls.append(("shutdown",))

    def nvmlDeviceGetHandleByIndex(self, index):
        return f"handle{index}"

    def nvmlDeviceGetClockInfo(self, handle, clock):
        self.calls.append(("clock", handle, clock))
        return 1410

    def nvmlDeviceGetP2PStatus(self, first, second, capability):
        self.calls.append(("p2p", first, second, capability))
        return 2

    def nvmlDeviceGetMemoryInfo(self, handle):
        return self.Struct()

    def nvmlDeviceGetName(self, handle):
        return b"NVIDIA GeForce RTX 4090"

    def nvmlDeviceGetPowerUsage(self, handle):
        raise self.NVMLError("Not Supported")


def test_live_backend_turns_labels_into_handles_and_nvml_constants(monkeypatch):
    fake = FakePynvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    nvml = LiveNvml()

    assert nvml.call("nvmlDeviceGetClockInfo", "1", "SM") == 1410
    assert nvml.call("nvmlDeviceGetP2PStatus", "0", "1", "WRITE") == 2
    assert nvml.call("nvmlDeviceGetMemoryInfo", "0") == {"total": 2 * 1024**3, "used": 1024**2}
    assert nvml.call("nvmlDeviceGetName", "0") == "NVIDIA GeForce RTX 4090"
    with pytest.raises(NvmlCallError, match=r"nvmlDeviceGetPowerUsage\(0\): Not Supported"):
        nvml.call("nvmlDeviceGetPowerUsage", "0")
    with pytest.raises(NvmlCallError, match="not in this pynvml"):
        nvml.call("nvmlDeviceGetSomethingNew", "0")
    nvml.close()
    assert fake.calls == [("clock", "handle1", 1), ("p2p", "handle0", "handle1", 1), ("shutdown",)]


def test_live_backend_unavailable_without_pynvml_or_driver(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(NvmlUnavailable, match="pynvml"):
        LiveNvml()
    monkeypatch.setitem(sys.modules, "pynvml", FakePynvml(fail_init=True))
    with pytest.raises(NvmlUnavailable, match="Driver Not Loaded"):
        LiveNvml()
