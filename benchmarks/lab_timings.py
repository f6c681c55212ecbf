"""Benchmark (not a test): how long the lab and `provision apply` take, on 1 and on 3 hosts.

  .venv/bin/python -m benchmarks.lab_timings [--cold]

--cold builds the rootfs from scratch in a temporary cache first (mmdebstrap, ~1 min).
Prints one table of seconds measured in this run.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from provisioner.apply.hosts import apply_spec
from provisioner.spec import load_spec
from tests.lab.hosts import Lab
from tests.lab.rootfs import ensure_rootfs
from tests.lab.specs import host_entry, install_standin, instance_entry, write_spec


def timed(fn):
    started = time.monotonic()
    value = fn()
    return time.monotonic() - started, value


def measure(lab: Lab, count: int, workdir: Path) -> dict[str, float]:
    boot_s, hosts = timed(lambda: lab.boot_many([f"b{lab.boot_count + i}" for i in range(count)]))
    for host in hosts:
        install_standin(host)
    spec = load_spec(write_spec(
        workdir / f"spec{count}.yml",
        [host_entry(h) for h in hosts],
        [instance_entry(h, f"chat-{h.name}", 8000) for h in hosts],
    ))
    first_s, first = timed(lambda: apply_spec(spec))
    again_s, again = timed(lambda: apply_spec(spec))
    assert first.succeeded and again.succeeded, (first.problems, again.problems)
    assert again.changed == 0, f"re-apply changed {again.changed} tasks"
    for host in hosts:
        lab.destroy(host)
    return {"boot": boot_s, "first apply": first_s, "re-apply": again_s, "changed on re-apply": again.changed}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cold", action="store_true", help="also time a rootfs build from scratch")
    args = parser.parse_args()
    rows = []
    if args.cold:
        with tempfile.TemporaryDirectory(prefix="vp-rootfs-cold-") as cache:
            os.environ["VP_LAB_CACHE"] = cache
            _, seconds, built = ensure_rootfs()
            rows.append(("rootfs build, cold", seconds))
            del os.environ["VP_LAB_CACHE"]
    with tempfile.TemporaryDirectory() as workdir, Lab() as lab:
        rows.append((f"rootfs, {'built' if lab.rootfs_built else 'cached'}", lab.rootfs_seconds))
        for count in (1, 3):
            for name, value in measure(lab, count, Path(workdir)).items():
                rows.append((f"{name}, {count} host{'s' if count > 1 else ''}", value))
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value:8.2f}" if isinstance(value, float) else f"{name:<{width}}  {value:8d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
