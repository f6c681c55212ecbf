"""The lab from the command line.

  python -m tests.lab demo      boot a test host, plan + apply the example spec to it, audit it, drift it, audit, repair
  python -m tests.lab cleanup   remove what a killed lab left behind (containers, overlays, cgroups, bridge)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.lab.hosts import Lab, cleanup_stale
from tests.lab.specs import host_entry, install_standin, instance_entry, write_spec

DEMO_DIR = Path(".provision/demo")


def step(title: str) -> float:
    print(f"\n=== {title}", flush=True)
    return time.monotonic()


def provision(*args: str) -> int:
    command = [sys.executable, "-m", "provisioner.cli.main", *args]
    print("$ provision " + " ".join(args), flush=True)
    return subprocess.run(command).returncode


def demo() -> int:
    started = step("building/reusing the Debian bookworm rootfs and the lab bridge")
    with Lab() as lab:
        print(f"rootfs ready in {lab.rootfs_seconds:.1f} s ({'built' if lab.rootfs_built else 'cached'})")
        t = step("booting one test host (systemd-nspawn, systemd as PID 1)")
        host = lab.boot("demo")
        print(f"{host.name} at {host.address}: SSH answers after {time.monotonic() - t:.1f} s")
        step("installing the TEST DOUBLE `vllm` (a stand-in server: no GPU here)")
        install_standin(host)
        DEMO_DIR.mkdir(parents=True, exist_ok=True)
        spec = write_spec(
            DEMO_DIR / "spec.yml",
            [host_entry(host, shm_size="2G")],
            [instance_entry(host, "qwen7b", 8000, share=0.9, options={"max-model-len": 4096, "max-num-seqs": 128})],
        )
        print(f"spec written to {spec}")
        step("plan")
        if provision("plan", "--spec", str(spec)) != 0:
            return 1
        t = step("apply")
        if provision("apply", "--spec", str(spec)) != 0:
            return 1
        print(f"first apply: {time.monotonic() - t:.1f} s")
        t = step("apply again (must change nothing)")
        if provision("apply", "--spec", str(spec)) != 0:
            return 1
        print(f"second apply: {time.monotonic() - t:.1f} s")
        step("the instance answers from the bastion")
        with urllib.request.urlopen(f"http://{host.address}:8000/v1/models", timeout=5) as response:
            print(json.dumps(json.load(response), indent=2))
        print(host.ssh("systemctl status vllm-qwen7b.service --no-pager | head -5").stdout)
        step("audit (must pass)")
        if provision("audit", "spec", "--spec", str(spec)) != 0:
            return 1
        step("drift: someone caps the GPU at 300 W and stops the server; the audit names both (exit 1)")
        host.ssh("nvidia-smi -pl 300 && systemctl stop vllm-qwen7b.service")
        if provision("audit", "spec", "--spec", str(spec)) != 1:
            return 1
        step("apply repairs it; the audit passes again")
        if provision("apply", "--spec", str(spec)) != 0 or provision("audit", "spec", "--spec", str(spec)) != 0:
            return 1
    print(f"\ndemo done in {time.monotonic() - started:.1f} s; the lab is torn down")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.lab", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["demo", "cleanup"])
    args = parser.parse_args()
    if args.command == "cleanup":
        for line in cleanup_stale():
            print("removed", line)
        return 0
    return demo()


if __name__ == "__main__":
    sys.exit(main())
