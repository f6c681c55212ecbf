"""The lab from the command line.

  python -m tests.lab demo      boot a test host, plan + apply the example spec to it, audit it, drift it, audit, repair
  python -m tests.lab up [N]    boot N test hosts (default 1) and keep them up, for trying things by hand: prints how
                                to reach each and writes a spec for them (.provision/lab/spec.yml), then returns
  python -m tests.lab down      power off the hosts `up` keeps, and remove them and their bridge
  python -m tests.lab cleanup   remove what a killed lab left behind (containers, overlays, cgroups, bridge)

`up` leaves a process holding the lab (its bridge and hosts belong to a live process: tests/lab/hosts.py), which
`down` stops; its log is .provision/lab/hold.log. VP_LAB_BRIDGE and VP_LAB_NETWORK choose the bridge, as for the
tests.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.lab.hosts import Lab, cleanup_stale
from tests.lab.specs import host_entry, install_standin, instance_entry, write_spec

DEMO_DIR = Path(".provision/demo")
KEPT_DIR = Path(".provision/lab")  # what `up` writes: spec.yml, ready.json (the holder's pid, the hosts), hold.log
UP_TIMEOUT_S = 900  # a cold rootfs build included


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
            [instance_entry(host, "qwen3", 8000, share=0.9, options={"max-model-len": 4096, "max-num-seqs": 128})],
        )
        print(f"spec written to {spec}")
        step("plan")
        if provision("plan", "--spec", str(spec)) != 0:
            return 1
        t = step("apply")
        if provision("apply", "-q", "--spec", str(spec)) != 0:
            return 1
        print(f"first apply: {time.monotonic() - t:.1f} s")
        t = step("apply again (must change nothing)")
        if provision("apply", "-q", "--spec", str(spec)) != 0:
            return 1
        print(f"second apply: {time.monotonic() - t:.1f} s")
        step("the instance answers from the bastion")
        with urllib.request.urlopen(f"http://{host.address}:8000/v1/models", timeout=5) as response:
            print(json.dumps(json.load(response), indent=2))
        print(host.ssh("systemctl status vllm-qwen3.service --no-pager | head -5").stdout)
        step("audit (must pass)")
        if provision("audit", "spec", "--spec", str(spec)) != 0:
            return 1
        step("drift: someone caps the GPU at 300 W and stops the server; the audit names both (exit 1)")
        host.ssh("nvidia-smi -pl 300 && systemctl stop vllm-qwen3.service")
        if provision("audit", "spec", "--spec", str(spec)) != 1:
            return 1
        step("apply repairs it; the audit passes again")
        if provision("apply", "-q", "--spec", str(spec)) != 0 or provision("audit", "spec", "--spec", str(spec)) != 0:
            return 1
    print(f"\ndemo done in {time.monotonic() - started:.1f} s; the lab is torn down")
    return 0


def hold(count: int) -> int:
    """Boot `count` hosts and hold the lab until SIGTERM or SIGINT (`down`), then tear it down."""
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    signal.signal(signal.SIGINT, lambda *_: stop.append(True))
    with Lab() as lab:
        hosts = lab.boot_many([f"lab{index}" for index in range(count)])
        for host in hosts:
            install_standin(host)
        spec = write_spec(KEPT_DIR / "spec.yml", [host_entry(host) for host in hosts],
                          [instance_entry(host, f"chat{index}", 8000) for index, host in enumerate(hosts)])
        ready = {"pid": os.getpid(), "bridge": lab.bridge, "spec": str(spec.resolve()),
                 "hosts": [{"name": host.name, "address": host.address, "ssh": " ".join(host.ssh_command())}
                           for host in hosts]}
        (KEPT_DIR / "ready.json").write_text(json.dumps(ready, indent=1))
        print(f"holding {count} host(s) on {lab.bridge}", flush=True)
        while not stop:
            time.sleep(0.5)
        (KEPT_DIR / "ready.json").unlink(missing_ok=True)
    print("lab torn down", flush=True)
    return 0


def up(count: int) -> int:
    """Start the holder apart from this process and wait until its hosts answer."""
    if (KEPT_DIR / "ready.json").exists():
        print(f"a lab is up already ({KEPT_DIR / 'ready.json'}): `python -m tests.lab down` first", file=sys.stderr)
        return 1
    KEPT_DIR.mkdir(parents=True, exist_ok=True)
    with (KEPT_DIR / "hold.log").open("w") as log:
        holder = subprocess.Popen([sys.executable, "-m", "tests.lab", "hold", str(count)], stdout=log,
                                  stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + UP_TIMEOUT_S
    while not (KEPT_DIR / "ready.json").exists():
        if holder.poll() is not None or time.monotonic() > deadline:
            holder.terminate()
            print(f"the lab did not come up:\n{(KEPT_DIR / 'hold.log').read_text()[-3000:]}", file=sys.stderr)
            return 1
        time.sleep(0.5)
    ready = json.loads((KEPT_DIR / "ready.json").read_text())
    for host in ready["hosts"]:
        print(f"{host['name']} at {host['address']}: {host['ssh']}")
    print(f"a spec for them (one stand-in instance each): {ready['spec']}\n"
          f"  .venv/bin/provision plan --spec {ready['spec']}\n"
          "when done: .venv/bin/python -m tests.lab down")
    return 0


def down() -> int:
    try:
        pid = json.loads((KEPT_DIR / "ready.json").read_text())["pid"]
    except (OSError, ValueError, KeyError):
        print("no lab is up (nothing in .provision/lab/ready.json)")
        return 0
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        (KEPT_DIR / "ready.json").unlink(missing_ok=True)
        print("its holder was gone; `python -m tests.lab cleanup` removes what it left")
        return 0
    deadline = time.monotonic() + 120
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    print("lab down" if not Path(f"/proc/{pid}").exists() else f"pid {pid} still running after 120 s")
    return 0 if not Path(f"/proc/{pid}").exists() else 1


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.lab", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["demo", "up", "down", "hold", "cleanup"])
    parser.add_argument("count", nargs="?", type=int, default=1, help="up: how many hosts")
    args = parser.parse_args()
    if args.command == "cleanup":
        for line in cleanup_stale():
            print("removed", line)
        return 0
    if args.command in ("up", "hold") and not 1 <= args.count <= 50:
        parser.error("count: 1 to 50 hosts")
    commands = {"demo": demo, "up": lambda: up(args.count), "down": down, "hold": lambda: hold(args.count)}
    return commands[args.command]()


if __name__ == "__main__":
    sys.exit(main())
