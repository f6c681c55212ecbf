"""Role nvidia_gpu on real systemd test hosts, against the TEST DOUBLE nvidia-smi (no GPU here).

The stand-in (tests/doubles/nvidia_smi_standin.py) answers from the constructed 2× RTX 4090 fixture:
seed 3's cards, capped at 300 W, persistence mode off. It keeps its state under /run, so every boot
starts from the cap again (as a real card forgets its limit), and logs every call it receives.
The inventory comes from a spec, as `provision apply` makes it; the playbook runs the role alone.

Run them on a lab bridge of their own (other labs may be running):
  VP_LAB_BRIDGE=vpgpu0 VP_LAB_NETWORK=10.88.4.0/24 .venv/bin/python -m pytest tests/integration/test_nvidia_gpu.py
"""

from __future__ import annotations

from pathlib import Path

from provisioner.apply.events import TaskResult
from provisioner.apply.playbook import run_playbook
from provisioner.base.paths import COLLECTION
from provisioner.fleet.inventory import write_inventory
from provisioner.spec import load_spec
from tests.doubles import nvidia_smi_standin as standin
from tests.integration.conftest import disk_state
from tests.lab.specs import host_entry, write_spec

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "gpu" / "rtx4090x2"
UUIDS = ["GPU-0c1d2e3f-4a5b-4c6d-8e7f-9a0b1c2d3e4f", "GPU-f4e3d2c1-b0a9-4f8e-9d7c-6b5a4f3e2d1c"]
UNIT = "nvidia-gpu-limits.service"
PLAYBOOK = f"""
- name: The GPU layer alone
  hosts: vllm_hosts
  gather_facts: false
  roles:
    - role: {COLLECTION}.nvidia_gpu
      vars:
        nvidia_gpu_retry_seconds: 2
"""


def gpu_host(host, power_limit=450) -> dict:
    entry = host_entry(host)
    entry["gpus"] = {
        "expected_count": 2,
        "persistence_mode": True,
        "devices": [
            {"index": index, "uuid": uuid, "model": "NVIDIA GeForce RTX 4090", "power_limit": power_limit}
            for index, uuid in enumerate(UUIDS)
        ],
    }
    return entry


class Run:
    """Applies the role to one host from a spec; keeps every task result of the last run."""

    def __init__(self, tmp_path: Path, host_data: dict):
        spec = load_spec(write_spec(tmp_path / "spec.yml", [host_data], []))
        self.inventory = tmp_path / "inventory"
        write_inventory(spec, self.inventory)
        self.playbook = tmp_path / "nvidia_gpu.yml"
        self.playbook.write_text(PLAYBOOK)
        self.results: list[TaskResult] = []

    def __call__(self, check: bool = False, diff: bool = False):
        self.results = []
        return run_playbook(self.inventory, playbook=self.playbook, check=check, diff=diff,
                            on_result=self.results.append)

    def task(self, name: str) -> TaskResult:
        return next(result for result in self.results if result.task == name)


def setters(calls: list[dict]) -> list[list[str]]:
    return [call["argv"] for call in standin.setter_calls(calls)]


def limits(host) -> list[tuple[str, str]]:
    return [(gpu["power.limit"], gpu["persistence_mode"]) for gpu in standin.standin_gpus(host)]


def wait_until_active(host, unit: str, timeout: float = 60) -> str:
    shown = host.ssh(
        f"for i in $(seq {int(timeout * 2)}); do s=$(systemctl is-active {unit}); "
        f"[ \"$s\" = active ] || [ \"$s\" = failed ] && break; sleep 0.5; done; echo $s", check=False
    ).stdout.strip()
    return shown


def test_apply_sets_the_limits_once_and_every_boot_sets_them_again(boot, tmp_path):
    (host,) = boot(1)
    standin.install(host, FIXTURE)
    assert limits(host) == [("300.00", "Disabled")] * 2  # seed 3: capped at 300 W
    apply = Run(tmp_path, gpu_host(host))

    first = apply()

    assert first.succeeded, first.problems
    assert first.stats[host.name].changed > 0
    assert setters(standin.recorded_calls(host)) == [
        ["-i", UUIDS[0], "-pm", "1"], ["-i", UUIDS[1], "-pm", "1"],
        ["-i", UUIDS[0], "-pl", "450"], ["-i", UUIDS[1], "-pl", "450"],
    ]
    assert limits(host) == [("450.00", "Enabled")] * 2
    config = host.ssh("cat /etc/vllm-provision/nvidia-gpu-limits.conf").stdout
    assert "persistence_mode on" in config and f"{UUIDS[0]} 450" in config and f"{UUIDS[1]} 450" in config
    host.ssh(f"systemd-analyze verify /etc/systemd/system/{UNIT}")
    assert host.ssh(f"systemctl is-enabled {UNIT}; systemctl is-active {UNIT}").stdout.split() == ["enabled", "active"]

    calls_before = len(standin.recorded_calls(host))
    second = apply()
    assert second.succeeded, second.problems
    assert second.stats[host.name].changed == 0, "a second apply must change nothing"
    assert setters(standin.recorded_calls(host)[calls_before:]) == []

    # a reboot: the cards come back at 300 W with persistence off, and the driver answers only
    # from the third call on: the unit fails, systemd tries again, the limits are back
    host.ssh(f"echo 2 > {standin.FAIL_AT_BOOT}")
    host.reboot()
    assert wait_until_active(host, UNIT) == "active", host.ssh(f"journalctl -u {UNIT} --no-pager", check=False).stdout
    boot_id = host.ssh("cat /proc/sys/kernel/random/boot_id").stdout.strip()
    this_boot = [call for call in standin.recorded_calls(host) if call["boot_id"] == boot_id]
    assert [call["status"] for call in this_boot[:2]] == [9, 9], "the driver was not up for the first calls"
    assert setters(this_boot) == [
        ["-i", UUIDS[0], "-pm", "1"], ["-i", UUIDS[1], "-pm", "1"],
        ["-i", UUIDS[0], "-pl", "450"], ["-i", UUIDS[1], "-pl", "450"],
    ]
    assert int(host.ssh(f"systemctl show -p NRestarts --value {UNIT}").stdout) >= 1
    assert limits(host) == [("450.00", "Enabled")] * 2

    third = apply()
    assert third.succeeded, third.problems
    assert third.stats[host.name].changed == 0


def test_check_mode_on_a_fresh_host_changes_nothing_and_sets_nothing(boot, tmp_path):
    (host,) = boot(1)
    standin.install(host, FIXTURE)
    apply = Run(tmp_path, gpu_host(host))
    before = disk_state(host)

    result = apply(check=True, diff=True)

    assert result.succeeded, result.problems
    assert result.stats[host.name].changed > 0, "check mode must report what would change"
    assert setters(standin.recorded_calls(host)) == []
    assert limits(host) == [("300.00", "Disabled")] * 2
    after = disk_state(host)
    assert after == before, {k: (before.get(k), after.get(k)) for k in set(before) | set(after) if before.get(k) != after.get(k)}
    (diff,) = apply.task("Set persistence mode and the power limits").diffs
    assert "persistence_mode: off" in diff["before"] and "power_limit: 300 W" in diff["before"]
    assert "persistence_mode: on" in diff["after"] and "power_limit: 450 W" in diff["after"]


def test_without_a_driver_and_out_of_range_nothing_is_set(boot, tmp_path):
    (host,) = boot(1)
    apply = Run(tmp_path, gpu_host(host, power_limit=600))

    # no NVIDIA driver at all: check mode stops with the reason, as the real run does (an honest dry run)
    checked = apply(check=True)
    assert not checked.succeeded
    real = apply()
    assert not real.succeeded
    for run in (checked, real):
        assert "No NVIDIA driver found" in run.problems[0].message and "nvidia-smi" in run.problems[0].message
        assert run.problems[0].label.endswith("nvidia_gpu : Stop on a host without the NVIDIA driver")

    # 600 W on a 150–450 W card: refused before anything is set
    standin.install(host, FIXTURE)
    refused = apply()
    assert not refused.succeeded
    message = refused.problems[0].message
    assert f"GPU 0 (NVIDIA GeForce RTX 4090, {UUIDS[0]}): power limit 600 W is outside the card's range 150–450 W" in message
    assert f"GPU 1 (NVIDIA GeForce RTX 4090, {UUIDS[1]})" in message
    assert setters(standin.recorded_calls(host)) == []
    assert limits(host) == [("300.00", "Disabled")] * 2
    assert host.ssh(f"test -e /etc/systemd/system/{UNIT}", check=False).returncode == 1

