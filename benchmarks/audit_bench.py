"""Benchmark (not a test): how long `provision audit` takes on 1 host and on N hosts, warm.

  VP_LAB_BRIDGE=vpaud0 VP_LAB_NETWORK=10.88.3.0/24 .venv/bin/python -m benchmarks.audit_bench [--hosts N] [--runs R]

Boots N lab hosts (default 8), applies a spec with one instance each, then times the audit of the
first host alone and of all N: one cold run (opens the SSH masters), then R warm runs (the masters
are open, as for a second `provision audit` within two minutes); the median warm run counts.
Prints checks, seconds, checks per second, where the time went (connect, first check: the facts read, the
rest) and the N-host / 1-host time ratio. Targets: one host <= 1.0 s warm; N hosts <= 2x one host.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

from provisioner.apply.hosts import apply_spec
from provisioner.audit.expectations import Target, spec_targets
from provisioner.audit.runner import audit_hosts, disconnect, exit_code
from provisioner.spec import load_spec
from tests.lab.hosts import Lab
from tests.lab.specs import host_entry, install_standin, instance_entry, write_spec


class Timeline:
    """When the last host connected, when the first check finished, when all were done (s after start)."""

    def __init__(self):
        self.start = time.monotonic()
        self.connected = self.first_check = 0.0

    def __call__(self, host: str, event: str, value) -> None:
        now = time.monotonic() - self.start
        if event == "connected":
            self.connected = max(self.connected, now)
        elif event == "check" and not self.first_check:
            self.first_check = now


def machine_busy_seconds() -> float:
    """CPU seconds every core of this machine has spent busy since boot (/proc/stat: all but idle and iowait)."""
    fields = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def auditor_seconds() -> float:
    """CPU seconds of this process and its finished children (the ssh clients it started)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def timed_audit(targets: list[Target]) -> dict:
    """One audit of `targets`: wall seconds, checks, timeline, and the CPU seconds it cost this machine (all of
    it: the auditor, its ssh clients and the hosts' side, which runs on these same cores) and the auditor."""
    busy, auditor = machine_busy_seconds(), auditor_seconds()
    timeline = Timeline()
    reports = audit_hosts(targets, on_progress=timeline)
    seconds = time.monotonic() - timeline.start
    assert exit_code(reports) == 0, {name: report.status for name, report in reports.items()}
    return {"seconds": seconds, "checks": sum(len(report.checks) for report in reports.values()),
            "timeline": timeline, "machine_cpu": machine_busy_seconds() - busy, "auditor_cpu": auditor_seconds() - auditor}


def measure(targets: list[Target], runs: int) -> dict:
    cold = timed_audit(targets)["seconds"]
    warm = sorted((timed_audit(targets) for _ in range(runs)), key=lambda run: run["seconds"])
    return {**warm[len(warm) // 2], "hosts": len(targets), "cold": cold,
            "spread": statistics.pstdev(run["seconds"] for run in warm)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=8, help="N, the hosts of the second measurement (at least 2)")
    parser.add_argument("--runs", type=int, default=5, help="warm runs per measurement (the median counts)")
    parser.add_argument("--settle", type=float, default=20, help="seconds to let the hosts settle after apply")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir, Lab() as lab:
        started = time.monotonic()
        hosts = lab.boot_many([f"ab{index}" for index in range(args.hosts)])
        for host in hosts:
            install_standin(host)
        spec = load_spec(write_spec(Path(workdir) / "spec.yml", [host_entry(host) for host in hosts],
                                    [instance_entry(host, f"chat-{host.name}", 8000) for host in hosts]))
        applied = apply_spec(spec)
        assert applied.succeeded, applied.problems
        print(f"{args.hosts} hosts booted and applied in {time.monotonic() - started:.0f} s", flush=True)
        time.sleep(args.settle)  # the units just (re)started; the 8 hosts share this machine's cores
        targets = spec_targets(spec)
        rows = [measure(targets[:1], args.runs), measure(targets, args.runs)]
        disconnect([target.connection for target in targets])  # before the lab powers the hosts off
    print(f"\n{'hosts':>5} {'checks':>6} {'cold s':>7} {'warm s':>7} {'±':>5} {'checks/s':>8}"
          f" {'connected':>9} {'1st check':>9} {'CPU s':>6} {'auditor':>7}")
    for row in rows:
        timeline = row["timeline"]
        print(f"{row['hosts']:>5} {row['checks']:>6} {row['cold']:>7.2f} {row['seconds']:>7.2f} {row['spread']:>5.2f}"
              f" {row['checks'] / row['seconds']:>8.1f} {timeline.connected:>9.2f} {timeline.first_check:>9.2f}"
              f" {row['machine_cpu']:>6.2f} {row['auditor_cpu']:>7.2f}")
    one, many = rows
    ratio = many["seconds"] / one["seconds"]
    cores = os.cpu_count() or 1
    floor = many["machine_cpu"] / cores  # the N-host audit cannot end sooner on this machine's cores
    print(f"\nCPU s: what the warm audit cost this machine's {cores} cores in all (the auditor, its ssh clients and"
          " every host's side: the lab's hosts share these cores); auditor: this process and its ssh clients."
          f"\n{many['hosts']} hosts: {many['machine_cpu']:.2f} CPU s on {cores} cores = a floor of {floor:.2f} s wall"
          f" ({floor / one['seconds']:.2f}x one host); the auditor's part {many['auditor_cpu']:.2f} s"
          f" ({many['auditor_cpu'] / max(one['auditor_cpu'], 1e-9):.2f}x one host's), what a fleet of separate"
          " machines would leave to scale on the bastion")
    print(f"\nload average now: {' '.join(f'{load:.1f}' for load in os.getloadavg())} on {os.cpu_count()} cores"
          " (the lab's hosts run on these cores too: their side of the audit competes with the auditor)")
    print(f"\n1 host: {one['checks']} checks in {one['seconds']:.2f} s warm "
          f"(target <= 1.0 s: {'met' if one['seconds'] <= 1.0 else 'MISSED'})")
    print(f"{many['hosts']} hosts: {many['checks']} checks in {many['seconds']:.2f} s warm")
    print(f"{many['hosts']} hosts / 1 host: {ratio:.2f}x (target <= 2x: {'met' if ratio <= 2 else 'MISSED'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
