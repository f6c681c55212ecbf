"""Benchmark (not a test): what one task on one host costs the controller at the least, in Ansible itself
(issue 33, point 5: a no-change apply within 1.5 controller CPU-seconds per host).

  .venv/bin/python -m benchmarks.ansible_floor [--tasks 120] [--hosts 1,8] [--repeat 3]

A playbook of --tasks tasks that do the least a task can (`debug`, half of them skipped by `when`, as a
no-change apply skips about 40 % of its tasks), on --hosts inventories of local hosts (connection local: no
ssh, no module transfer), run by this checkout's ansible-playbook with the settings an apply uses (forks 16;
Mitogen's strategy where it is installed, and Ansible's linear one). Prints, from this run, the controller CPU
seconds (user + system of ansible-playbook and every process it ran) per size, the marginal CPU per host and
per host-task, and how many such tasks one host could have within 1.5 CPU-seconds.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from provisioner.base.ansible_config import STRATEGY, mitogen_strategy_dir

BUDGET_S = 1.5  # issue 33: controller CPU-seconds per host per no-change apply


def playbook(folder: Path, tasks: int) -> Path:
    steps = [{"name": f"step {index}", "ansible.builtin.debug": {"msg": "ok"}, "when": index % 2 == 0}
             for index in range(tasks)]
    path = folder / "floor.yml"
    path.write_text(yaml.safe_dump([{"hosts": "all", "gather_facts": False, "tasks": steps}], sort_keys=False))
    return path


def inventory(folder: Path, hosts: int) -> Path:
    path = folder / f"hosts-{hosts}.ini"
    path.write_text("".join(f"h{index} ansible_connection=local ansible_python_interpreter={sys.executable}\n"
                            for index in range(hosts)))
    return path


def cpu_seconds(command: list[str], environment: dict[str, str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   check=True, env=environment)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=120, help="tasks of the playbook (half skipped)")
    parser.add_argument("--hosts", default="1,8", help="two fleet sizes, comma-separated")
    parser.add_argument("--repeat", type=int, default=3, help="runs per size (the median is shown)")
    args = parser.parse_args()
    small, large = (int(size) for size in args.hosts.split(","))
    ansible_playbook = str(Path(sys.executable).with_name("ansible-playbook"))
    strategies = {"linear": {}}
    if mitogen_strategy_dir() is not None:
        strategies[STRATEGY] = {"ANSIBLE_STRATEGY": STRATEGY, "ANSIBLE_STRATEGY_PLUGINS": str(mitogen_strategy_dir())}
    print(f"{'strategy':<24} {'hosts':>5} {'CPU s':>7} {'marginal CPU s/host':>20} {'ms/host-task':>13} "
          f"{'tasks within 1.5 s':>18}  (load {os.getloadavg()[0]:.1f})")
    with tempfile.TemporaryDirectory() as folder:
        book = playbook(Path(folder), args.tasks)
        for name, extra in strategies.items():
            environment = {**os.environ, "ANSIBLE_FORKS": "16", "ANSIBLE_DEPRECATION_WARNINGS": "False", **extra}
            measured = {}
            for hosts in (small, large):
                command = [ansible_playbook, "-i", str(inventory(Path(folder), hosts)), str(book)]
                measured[hosts] = statistics.median(cpu_seconds(command, environment) for _ in range(args.repeat))
            per_host = (measured[large] - measured[small]) / (large - small)
            per_task = per_host / args.tasks
            for hosts in (small, large):
                print(f"{name:<24} {hosts:>5} {measured[hosts]:>7.2f}")
            print(f"{name:<24} {'':>5} {'':>7} {per_host:>20.2f} {per_task * 1000:>13.1f} "
                  f"{int(BUDGET_S / per_task):>18}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
