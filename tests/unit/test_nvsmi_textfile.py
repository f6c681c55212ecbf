"""The GPU timer's script (roles/node_exporter/files/nvsmi-textfile): its parsing of nvidia-smi's answers as a
real H200 gave them (tests/fixtures/monitoring/h200-nvsmi/), the ECC fields a card does not report, and the Xid
counters read from the kernel log (lines in the format NVIDIA's driver writes), run end to end with a fake
nvidia-smi and a fake journalctl on the PATH."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "roles/node_exporter/files/nvsmi-textfile"
H200 = REPO / "tests/fixtures/monitoring/h200-nvsmi"
H200_UUID = "GPU-f2e33add-1ca2-c1cb-b40c-6184fb896ce5"

# Xid lines as the driver writes them (journalctl -o cat: the message only): docs.nvidia.com/deploy/xid-errors,
# github.com/NVIDIA/open-gpu-kernel-modules issues 1045 and 1151, stas00/ml-engineering's debug.md
RECORDED_FORMAT_LINES = [
    "NVRM: GPU at PCI:0000:2b:00: GPU-0b11d014-1685-04bd-26ed-5fc0bc1c44ae",
    "NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.",
    "NVRM: GPU 0000:2b:00.0: GPU has fallen off the bus.",
    "NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, reset gpu to activate.",
    "NVRM: Xid (PCI:0000:01:00): 62, 223b6a66 00002100 00000000 20662342 20662ba6 20664272 2065f7ca 2063f48c",
    "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
    "NVRM: Xid (PCI:0000:01:00): 45, pid=12542, name=VLLM::Worker, channel 0x00000002",
    "NVRM: Xid (PCI:0000:3B:00): 79, pid=1234, name=python, GPU has fallen off the bus.",
    "nvidia-nvlink: Nvlink Core is being initialized",
]


@pytest.fixture(scope="module")
def script():
    loader = importlib.machinery.SourceFileLoader("nvsmi_textfile", str(SCRIPT))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_xid_lines_give_bus_id_and_code(script):
    assert script.xid_events(RECORDED_FORMAT_LINES) == [
        ("0000:2b:00", 79), ("0000:10:1c", 63), ("0000:01:00", 62), ("0000:01:00", 154), ("0000:01:00", 45),
        ("0000:3b:00", 79)]


def test_nvidia_smi_bus_ids_are_written_as_the_xid_lines_write_them(script):
    assert script.gpu_bus_id("00000000:3B:00.0") == "0000:3b:00"
    assert script.gpu_bus_id("00000000:00:06.0") == "0000:00:06"
    assert script.gpu_bus_id("[N/A]") is None


def test_ecc_fields_a_card_does_not_report_are_left_out(script):
    gpus = [{"index": "0", "uuid": "GPU-a", "name": "NVIDIA GeForce RTX 3090"},
            {"index": "1", "uuid": "GPU-b", "name": "NVIDIA H200"}, {"index": "2", "uuid": "GPU-c", "name": "NVIDIA H200"}]
    ecc = [{"uuid": "GPU-a", "ecc.errors.corrected.volatile.total": "[N/A]",
            "ecc.errors.uncorrected.volatile.total": "[Not Supported]"},
           {"uuid": "GPU-b", "ecc.errors.corrected.volatile.total": "12", "ecc.errors.uncorrected.volatile.total": "0"}]
    lines = [line for line in script.exposition(gpus, ecc) if line.startswith("nvsmi_ecc")]
    assert lines == [
        'nvsmi_ecc_errors_corrected_volatile{gpu="1",gpu_uuid="GPU-b",gpu_name="NVIDIA H200"} 12.0',
        'nvsmi_ecc_errors_uncorrected_volatile{gpu="1",gpu_uuid="GPU-b",gpu_name="NVIDIA H200"} 0.0']
    # no card reports ECC (or the second call failed): no ECC family at all
    assert not [line for line in script.exposition(gpus[:1], ecc[:1]) if "ecc" in line]
    assert not [line for line in script.exposition(gpus[:1], None) if "ecc" in line]


FAKE_NVIDIA_SMI = """#!{python}
import os, sys
query = [a for a in sys.argv if a.startswith("--query-gpu=")][0]
if os.environ.get("FAKE_NVIDIA_SMI_FAILS"):
    sys.exit("Unable to determine the device handle for GPU0000:00:06.0: Unknown Error")
name = "query-ecc.csv" if "ecc." in query else "query-gpu.csv"
sys.stdout.write(open(os.path.join(os.environ["FAKE_NVIDIA_SMI_DIR"], name)).read())
"""
# journalctl -b 0 MATCH -o cat --no-pager -q --show-cursor [--after-cursor=N]: the lines of FAKE_JOURNAL (a JSON
# list) after entry N, then the cursor of the last one shown; none shown: nothing, exit status 1 (what systemd
# 252's journalctl does, seen on the lab's Debian 12 hosts)
FAKE_JOURNALCTL = """#!{python}
import json, os, sys
entries = json.load(open(os.environ["FAKE_JOURNAL"]))
after = [int(a.split("=", 1)[1]) for a in sys.argv if a.startswith("--after-cursor=")]
start = after[0] + 1 if after else 0
with open(os.environ["FAKE_JOURNAL"] + ".calls", "a") as log:
    log.write(" ".join(sys.argv[1:]) + "\\n")
shown = entries[start:]
for line in shown:
    print(line)
if not shown:
    sys.exit(1)
print("-- cursor: %d" % (len(entries) - 1))
"""


@pytest.fixture
def bench(tmp_path):
    """A folder with a fake nvidia-smi (answering the H200 recording) and journalctl on the PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("nvidia-smi", FAKE_NVIDIA_SMI), ("journalctl", FAKE_JOURNALCTL)):
        (bin_dir / name).write_text(text.format(python=sys.executable))
        (bin_dir / name).chmod(0o755)
    (tmp_path / "textfile").mkdir()
    journal = tmp_path / "journal.json"
    journal.write_text("[]")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_NVIDIA_SMI_DIR": str(H200),
           "FAKE_JOURNAL": str(journal)}
    env.pop("NVSMI_TEXTFILE_KERNEL_MATCH", None)
    return {"dir": tmp_path, "env": env, "journal": journal}


def collect(bench, **env: str) -> tuple[int, list[str]]:
    """One run of the script, as the timer runs it; its exit status and nvsmi.prom's sample lines."""
    result = subprocess.run([sys.executable, SCRIPT, "--nvidia-smi", "nvidia-smi", "--xid-state",
                             bench["dir"] / "xid.json", bench["dir"] / "textfile"], env={**bench["env"], **env})
    text = (bench["dir"] / "textfile" / "nvsmi.prom").read_text()
    return result.returncode, [line for line in text.splitlines() if not line.startswith("#")]


def test_the_h200_recording_parses_to_every_metric(bench):
    status, samples = collect(bench)
    assert status == 0
    labels = f'{{gpu="0",gpu_uuid="{H200_UUID}",gpu_name="NVIDIA H200"}}'
    assert [line for line in samples if not line.startswith("nvsmi_timestamp_seconds")] == [
        "nvsmi_up 1",
        f"nvsmi_power_draw_watts{labels} 100.87", f"nvsmi_power_limit_watts{labels} 700.0",
        f"nvsmi_enforced_power_limit_watts{labels} 700.0", f"nvsmi_power_default_limit_watts{labels} 700.0",
        f"nvsmi_power_max_limit_watts{labels} 700.0", f"nvsmi_clock_sm_hertz{labels} 345000000.0",
        f"nvsmi_clock_sm_max_hertz{labels} 1980000000.0", f"nvsmi_clock_memory_hertz{labels} 3201000000.0",
        f"nvsmi_memory_total_bytes{labels} {143771 * 1048576}.0", f"nvsmi_memory_used_bytes{labels} 0.0",
        f"nvsmi_temperature_celsius{labels} 38.0",
        *[f'nvsmi_clocks_event_active{labels[:-1]},reason="{reason}"}} {1 if reason == "gpu_idle" else 0}'
          for reason in ("gpu_idle", "applications_clocks_setting", "sw_power_cap", "hw_slowdown", "sync_boost",
                         "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown",
                         "display_clock_setting")],
        # ECC enabled on the H200: its real zeros
        f"nvsmi_ecc_errors_corrected_volatile{labels} 0.0", f"nvsmi_ecc_errors_uncorrected_volatile{labels} 0.0",
        "nvsmi_kernel_log_up 1"]


def test_xid_lines_are_counted_once_each_per_bus_id_and_code_with_the_gpu_s_labels(bench):
    h200 = f'gpu="0",gpu_uuid="{H200_UUID}",gpu_name="NVIDIA H200",pci_bus_id="0000:00:06"'
    bench["journal"].write_text(json.dumps([
        "NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (nixbld@)",
        "NVRM: Xid (PCI:0000:00:06): 79, pid=1234, name=python, GPU has fallen off the bus."]))
    assert collect(bench)[1][-2:] == ["nvsmi_kernel_log_up 1", f'nvsmi_xid_errors_total{{{h200},xid="79"}} 1']
    # the next run reads only what came after its cursor: the old line is not counted again
    entries = json.loads(bench["journal"].read_text()) + [
        "NVRM: Xid (PCI:0000:00:06): 79, pid=1234, name=python, GPU has fallen off the bus.",
        "NVRM: Xid (PCI:0000:00:06): 48, pid=1234, name=python, An uncorrectable double bit error",
        "NVRM: Xid (PCI:0000:41:00): 13, Graphics Exception: ESR 0x405840=0x0"]
    bench["journal"].write_text(json.dumps(entries))
    status, samples = collect(bench)
    assert status == 0
    assert samples[-4:] == ["nvsmi_kernel_log_up 1", f'nvsmi_xid_errors_total{{{h200},xid="48"}} 1',
                            f'nvsmi_xid_errors_total{{{h200},xid="79"}} 2',
                            'nvsmi_xid_errors_total{pci_bus_id="0000:41:00",xid="13"} 1']
    calls = Path(str(bench["journal"]) + ".calls").read_text().splitlines()
    assert calls == ["-b 0 _TRANSPORT=kernel -o cat --no-pager -q --show-cursor",
                     "-b 0 _TRANSPORT=kernel -o cat --no-pager -q --show-cursor --after-cursor=1"]
    # nothing new: the same counts, the same cursor
    assert collect(bench)[1][-4:] == samples[-4:]
    assert json.loads((bench["dir"] / "xid.json").read_text())["cursor"] == "4"
    # when nvidia-smi fails (a GPU off the bus), the counters stay, with the GPU's labels from before
    status, samples = collect(bench, FAKE_NVIDIA_SMI_FAILS="1")
    assert status == 1
    assert samples[0] == "nvsmi_up 0" and samples[-3:] == [f'nvsmi_xid_errors_total{{{h200},xid="48"}} 1',
                                                             f'nvsmi_xid_errors_total{{{h200},xid="79"}} 2',
                                                             'nvsmi_xid_errors_total{pci_bus_id="0000:41:00",xid="13"} 1']


def test_the_test_seam_changes_the_journal_match_only(bench):
    collect(bench, NVSMI_TEXTFILE_KERNEL_MATCH="SYSLOG_IDENTIFIER=kernel")
    assert Path(str(bench["journal"]) + ".calls").read_text() == \
        "-b 0 SYSLOG_IDENTIFIER=kernel -o cat --no-pager -q --show-cursor\n"


def test_a_new_boot_counts_from_zero(script, tmp_path):
    state = {"boot_id": "old", "cursor": "s=1", "counts": {"0000:00:06 79": 3}, "gpus": {}}
    (tmp_path / "xid.json").write_text(json.dumps(state))
    assert script.load_xid_state(str(tmp_path / "xid.json"), "old") == state
    assert script.load_xid_state(str(tmp_path / "xid.json"), "new") == {
        "boot_id": "new", "cursor": None, "counts": {}, "gpus": {}}


def test_a_failing_journalctl_keeps_the_counts_and_says_so(bench):
    bench["journal"].write_text(json.dumps(["NVRM: Xid (PCI:0000:00:06): 94, pid=1, name=python, Contained: SM"]))
    collect(bench)
    bench["journal"].write_text("not json: the fake journalctl fails")
    samples = collect(bench)[1]
    assert samples[-2:] == ["nvsmi_kernel_log_up 0", f'nvsmi_xid_errors_total{{gpu="0",gpu_uuid="{H200_UUID}",'
                                                     'gpu_name="NVIDIA H200",pci_bus_id="0000:00:06",xid="94"} 1']
