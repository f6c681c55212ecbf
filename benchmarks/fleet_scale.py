"""Benchmark (not a test): how a no-change apply and a warm audit scale with the fleet (issue 33, point 5).

  .venv/bin/python -m benchmarks.fleet_scale [--sizes 1,4,8,16] [--repeat 2]

Boots the largest size of lab hosts once (root; VP_LAB_BRIDGE / VP_LAB_NETWORK as for the lab tests), each with
the TEST DOUBLE vLLM and one instance; applies the spec of all of them once (converge). Then for each size, the
spec of that many hosts: one apply to converge it, then --repeat no-change applies and --repeat audits (the
command lines a user types, `provision apply` / `provision audit spec`, in a fresh Python each), each timed
(wall seconds) and its controller CPU counted (user + system seconds of the command and every process it ran:
ansible-playbook, its workers, ssh). Prints one table from this run: the median per size, the ratio to one
host, and the CPU seconds per host; the machine's load average beside it.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.lab.hosts import Lab
from tests.lab.specs import host_entry, install_standin, instance_entry, write_spec

PROVISION = [sys.executable, "-m", "provisioner.cli.main"]


def run(command: list[str]) -> tuple[float, float, subprocess.CompletedProcess]:
    """(wall seconds, controller CPU seconds of the command and its children, the run)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), done


def checked(command: list[str]) -> tuple[float, float]:
    wall, cpu, done = run(command)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command[2:])} exited {done.returncode}:\n{done.stdout[-3000:]}{done.stderr[-2000:]}")
    return wall, cpu


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1,4,8,16", help="fleet sizes, comma-separated")
    parser.add_argument("--repeat", type=int, default=2, help="timed runs per size and command (the median is shown)")
    args = parser.parse_args()
    sizes = sorted(int(size) for size in args.sizes.split(","))
    rows = []
    with tempfile.TemporaryDirectory(prefix="vp-fleet-") as workdir, Lab() as lab:
        hosts = lab.boot_many([f"fl{index}" for index in range(sizes[-1])])
        for host in hosts:
            install_standin(host)
        for size in sizes:
            fleet = hosts[:size]
            spec = str(write_spec(Path(workdir) / f"fleet{size}.yml", [host_entry(host) for host in fleet],
                                  [instance_entry(host, f"chat-{host.name}", 8000) for host in fleet]))
            checked([*PROVISION, "apply", "--spec", spec])  # converge (the first size installs everything)
            checked([*PROVISION, "audit", "spec", "--spec", spec])  # warm: its ssh masters open
            for command, name in (("apply", "no-change apply"), ("audit", "warm audit")):
                argv = [*PROVISION, "apply", "--spec", spec] if command == "apply" else \
                    [*PROVISION, "audit", "spec", "--spec", spec]
                measured = [checked(argv) for _ in range(args.repeat)]
                rows.append((name, size, statistics.median(wall for wall, _ in measured),
                             statistics.median(cpu for _, cpu in measured), os.getloadavg()[0]))
    print(f"{'measure':<16} {'hosts':>5} {'seconds':>8} {'x 1 host':>8} {'CPU s':>7} {'CPU s/host':>10} {'load':>5}")
    for name, size, wall, cpu, load in rows:
        one = next(row[2] for row in rows if row[0] == name and row[1] == sizes[0])
        print(f"{name:<16} {size:>5} {wall:>8.1f} {wall / one:>8.2f} {cpu:>7.1f} {cpu / size:>10.2f} {load:>5.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
