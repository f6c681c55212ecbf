"""Record the run's real events for tests/fixtures/ansible-events/ (tests/unit/test_apply_events.py
replays them): `apply --check --diff` on a fresh lab host, then on the same host after apply and three
of the audit tests' drifts. Needs root, like the lab tests.

  VP_LAB_BRIDGE=… VP_LAB_NETWORK=… python -m tests.lab.record_events [OUT_DIR]
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from provisioner.apply.playbook import run_playbook
from provisioner.fleet.inventory import write_inventory
from provisioner.spec import load_spec
from tests.lab.hosts import Lab
from tests.lab.specs import host_entry, install_standin, instance_entry, write_spec

OUT_DIR = Path(__file__).resolve().parent.parent / "fixtures" / "ansible-events"
# the tasks the unit tests read: template loops, no_log env files, a lineinfile, directories, check-mode notes
KEPT_TASKS = {"Write the sysctl drop-in", "Persist the size in /etc/fstab", "Write the units", "Write the config files",
              "Write the env files", "Create the configuration and probe directories",
              "Report the /dev/shm (re)mount check mode would do", "Say which new instances would be enabled (check mode)"}
KEPT_KEYS = {"host", "task", "role", "task_action", "ignore_errors", "res", "play",
             "ok", "changed", "failures", "dark", "skipped", "processed"}  # what provisioner.apply reads
DRIFTS = ("sed -i 's|^ExecStart=.*|& --enforce-eager|' /etc/systemd/system/vllm-chat.service",
          "chmod 0644 /etc/vllm/chat.env",
          "sed -i 's/^vm.swappiness = .*/vm.swappiness = 60/' /etc/sysctl.d/60-vllm-provision.conf")


def trimmed(events: list[dict]) -> list[dict]:
    kept = [event for event in events
            if event["event"] == "playbook_on_stats" or event["event_data"].get("task") in KEPT_TASKS]
    return [{"event": event["event"], "event_data": {key: value for key, value in event["event_data"].items()
                                                     if key in KEPT_KEYS}} for event in kept]


def check_diff(inventory: Path) -> list[dict]:
    events: list[dict] = []
    run_playbook(inventory, check=True, diff=True, on_event=events.append)
    return trimmed(events)


def main() -> int:
    out_dir = Path(sys.argv[1]) if len(sys.argv) > 1 else OUT_DIR
    with Lab() as lab, tempfile.TemporaryDirectory(prefix="record-events-") as folder:
        host = lab.boot("ev0")
        install_standin(host)  # nvidia-smi; vLLM comes from the spec's wheelhouse at apply
        key_file = Path(folder) / "chat.key"
        key_file.write_text("recorded-secret\n")
        spec = load_spec(write_spec(Path(folder) / "spec.yml", [host_entry(host)],
                                    [instance_entry(host, "chat", 8000, share=0.9, api_key_file=str(key_file))]))
        inventory = Path(folder) / "inventory"
        write_inventory(spec, inventory)
        recordings = {"fresh-host-check-diff": check_diff(inventory)}
        applied = run_playbook(inventory)
        if not applied.succeeded:
            sys.exit(f"apply failed: {applied.problems}")
        for drift in DRIFTS:
            host.ssh(drift)
        recordings["drifted-host-check-diff"] = check_diff(inventory)
    for name, events in recordings.items():
        (out_dir / f"{name}.json").write_text(json.dumps(events, indent=1) + "\n")
        print(f"{out_dir / name}.json: {len(events)} events")
    return 0


if __name__ == "__main__":
    sys.exit(main())
