"""Benchmark (not a test): what the structure costs a user, each measure beside the same measure on a
one-host spec, both taken in this run (issue 16, point 5).

  .venv/bin/python -m benchmarks.structure_costs [--hosts 200] [--repeat 3] [--apply] [--profile FILE]

Measured, each as the median of --repeat runs of the command line a user types (a fresh Python each):
`provision plan` of a generated spec (--hosts hosts, two instances each), `plan ONE` of it, apply's
preflight on it (`provision apply` of the same spec with one instance too big for its GPU: it stops
before contacting any host), apply's preflight for ONE, cold `provision --help`, `plan` of an example.
Nothing is contacted: the generated hosts have private lab addresses nobody answers on (10.88.15.10
and on). --apply also boots one lab host (root; VP_LAB_BRIDGE / VP_LAB_NETWORK as for the lab tests),
applies the lab spec once, then times --repeat more applies that change nothing (the median is shown);
--profile FILE writes the per-task seconds of one more apply (Ansible's junit callback, not timed) to FILE
as JSON, slowest first.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
PROVISION = [sys.executable, "-m", "provisioner.cli.main"]
EXAMPLE = ROOT / "inventory" / "examples" / "seed1-3090.yml"
NETWORK = ipaddress.ip_network("10.88.15.0/24")
MODEL = "Qwen/Qwen3-1.7B"  # the lab's model: two instances fit on one RTX 3090
TOO_BIG_MODEL = "Qwen/Qwen2.5-7B-Instruct"  # its bf16 weights alone exceed 0.45 of an RTX 3090
FIRST_HOST = "gen000"
REFUSED = "nothing applied"  # apply's preflight refused the spec before contacting a host


def generated_host(index: int) -> dict:
    """One host of the generated fleet: an RTX 3090, the lab's settings, an address nobody answers on."""
    address = NETWORK.network_address + 10 + index
    return {
        "name": f"gen{index:03d}",
        "address": str(address),
        "ssh": {"user": "root", "port": 22},
        "settings": {"swappiness": 1, "sysctls": {"vm.max_map_count": 262144}, "shm_size": "1G",
                     "nouveau_blacklist": True},
        "gpus": {"expected_count": 1, "devices": [
            {"index": 0, "uuid": f"GPU-00000000-1111-2222-3333-{index:012d}", "model": "NVIDIA GeForce RTX 3090",
             "power_limit": "max"}]},
        "vllm": {"version": "0.25.0", "install_path": "/opt/vllm"},
    }


def generated_instance(host: str, name: str, port: int, model: str = MODEL) -> dict:
    return {"name": name, "host": host, "model": model, "port": port, "gpus": [0],
            "gpu_memory_utilization": 0.45, "options": {"max-model-len": 4096, "block-size": 16}}


def write_fleet(path: Path, hosts: int, too_big: bool = False) -> Path:
    """A spec of `hosts` hosts with two instances each; too_big: the first host's second instance serves
    a model its share cannot hold (valid, but the memory plan refuses it: apply stops before contacting
    any host)."""
    entries = [generated_host(index) for index in range(hosts)]
    instances = []
    for entry in entries:
        second_model = TOO_BIG_MODEL if too_big and entry["name"] == FIRST_HOST else MODEL
        instances += [generated_instance(entry["name"], f"{entry['name']}-chat", 8000),
                      generated_instance(entry["name"], f"{entry['name']}-embed", 8001, second_model)]
    path.write_text(yaml.safe_dump({"version": 1, "hosts": entries, "instances": instances}, sort_keys=False))
    return path


def seconds(command: list[str], expect: int, repeat: int, says: str = "") -> float:
    """The median wall time of `command` (repeat runs); exits when it does not end with `expect`, or
    its output does not say `says`."""
    times = []
    for _ in range(repeat):
        started = time.monotonic()
        finished = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        times.append(time.monotonic() - started)
        if finished.returncode != expect or says not in finished.stdout + finished.stderr:
            sys.exit(f"{' '.join(command)} exited {finished.returncode}, not {expect}:\n"
                     f"{finished.stdout[-2000:]}{finished.stderr[-2000:]}")
    return statistics.median(times)


def structure_rows(folder: Path, hosts: int, repeat: int) -> list[tuple[str, float, float | None]]:
    """(measure, seconds on the fleet, seconds on one host: none where no spec is read) for the commands
    that contact nobody."""
    fleet, single = write_fleet(folder / "fleet.yml", hosts), write_fleet(folder / "one.yml", 1)
    fleet_big, single_big = (write_fleet(folder / "fleet-too-big.yml", hosts, too_big=True),
                             write_fleet(folder / "one-too-big.yml", 1, too_big=True))

    def both(args: list[str], large: Path, small: Path, expect: int, says: str = "") -> tuple[float, float]:
        return (seconds([*PROVISION, *args, "--spec", str(large)], expect, repeat, says),
                seconds([*PROVISION, *args, "--spec", str(small)], expect, repeat, says))

    return [
        (f"plan ({hosts} hosts, {2 * hosts} instances)", *both(["plan"], fleet, single, 0)),
        (f"plan {FIRST_HOST} (of {hosts} hosts)", *both(["plan", FIRST_HOST], fleet, single, 0)),
        (f"apply preflight ({hosts} hosts, refused)", *both(["apply"], fleet_big, single_big, 1, REFUSED)),
        (f"apply {FIRST_HOST} preflight (refused)", *both(["apply", FIRST_HOST], fleet_big, single_big, 1, REFUSED)),
        ("cold provision --help", seconds([*PROVISION, "--help"], 0, repeat), None),
        (f"plan {EXAMPLE.name}", seconds([*PROVISION, "plan", "--spec", str(EXAMPLE)], 0, repeat),
         seconds([*PROVISION, "plan", "--spec", str(single)], 0, repeat)),
    ]


def task_seconds(junit_dir: Path) -> tuple[list[tuple[str, float]], int]:
    """Per task (role/tasks/file.yml:line, then its name and arguments) the seconds the junit callback
    recorded, slowest first; and how many of the tasks were skipped."""
    tasks: dict[str, float] = {}
    skipped = 0
    for report in junit_dir.glob("*.xml"):
        for case in ElementTree.parse(report).iter("testcase"):
            where = case.get("classname", "").split("/roles/")[-1]
            name = f"{where} {case.get('name', '').split(' : ')[-1]}"
            tasks[name] = tasks.get(name, 0.0) + float(case.get("time") or 0)
            skipped += case.find("skipped") is not None
    return sorted(tasks.items(), key=lambda item: -item[1]), skipped


def no_change_apply(folder: Path, profile: Path | None, repeat: int) -> tuple[float, list[float], int, int, int]:
    """Boot one lab host, apply the lab spec to it, then time `repeat` more applies that change nothing
    (the CLI, a fresh Python each; Ansible's own settings, no extra callback): (median seconds, every
    run's seconds, tasks, tasks skipped, tasks changed). The per-task seconds come from one more apply
    with Ansible's junit callback, which costs time of its own and so is not among the timed runs.
    Needs root, like the lab tests."""
    from tests.lab.hosts import Lab
    from tests.lab.specs import host_entry, install_standin, instance_entry, write_spec

    with Lab() as lab:
        host = lab.boot("sc0")
        install_standin(host)
        spec = write_spec(folder / "lab.yml", [host_entry(host)], [instance_entry(host, "chat", 8000)])
        command = [*PROVISION, "apply", "--json", "--spec", str(spec)]
        subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True)

        def applied(environment: dict[str, str]) -> tuple[float, dict]:
            started = time.monotonic()
            finished = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=environment)
            elapsed = time.monotonic() - started
            if finished.returncode != 0:
                sys.exit(f"a no-change apply exited {finished.returncode}:\n"
                         f"{finished.stdout[-3000:]}{finished.stderr[-3000:]}")
            return elapsed, json.loads(finished.stdout)["hosts"][host.name]

        runs = [applied(dict(os.environ)) for _ in range(repeat)]
        junit_dir = folder / "junit"
        _, counts = applied({**os.environ, "ANSIBLE_CALLBACKS_ENABLED": "ansible.builtin.junit",
                             "JUNIT_OUTPUT_DIR": str(junit_dir), "JUNIT_TASK_CLASS": "yes"})
        tasks, skipped = task_seconds(junit_dir)
        if profile is not None:
            profile.write_text(json.dumps(tasks, indent=1))
        changed = max(counts["changed"], *(run_counts["changed"] for _, run_counts in runs))
        seconds_each = [elapsed for elapsed, _ in runs]
        return statistics.median(seconds_each), seconds_each, len(tasks), skipped, changed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=200, help="hosts of the generated spec (two instances each)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per measure (the median is shown)")
    parser.add_argument("--apply", action="store_true", help="also a no-change apply on one lab host (root)")
    parser.add_argument("--profile", type=Path, help="with --apply: write its per-task seconds here (JSON)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="structure-costs-") as folder:
        rows = structure_rows(Path(folder), args.hosts, args.repeat)
        print(f"{'measure':44} {'seconds':>8} {'one host':>9} {'ratio':>6}")
        for name, large, small in rows:
            compared = f"{small:9.2f} {large / small:6.1f}" if small is not None else f"{'-':>9} {'-':>6}"
            print(f"{name:44} {large:8.2f} {compared}")
        if args.apply:
            elapsed, each, tasks, skipped, changed = no_change_apply(Path(folder), args.profile, args.repeat)
            print(f"{'no-change apply (one lab host)':44} {elapsed:8.2f}   "
                  f"({tasks} tasks, {tasks - skipped} run, {changed} changed; runs "
                  f"{', '.join(f'{seconds:.2f}' for seconds in each)} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
