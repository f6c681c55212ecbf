"""Benchmark (not a test): a no-change run of the site playbook on one lab host, three ways, side by side in one run
(issue 36, point 5): `provision apply`; plain `ansible-playbook` of the built collection with an empty ansible.cfg
(Ansible's defaults); and plain `ansible-playbook` with the settings docs/ansible.md lists as what `provision apply`
sets where the user sets nothing (pipelining, ControlPersist, forks, interpreter_python, Mitogen's strategy).

  VP_LAB_BRIDGE=vplab3 VP_LAB_NETWORK=10.88.3.0/24 .venv/bin/python -m benchmarks.plain_ansible_speed [--repeat 3]

Boots one lab host (root), applies the lab spec once with `provision apply`, writes its inventory, installs the
collection's tarball into an empty collections path, then times --repeat runs of each way (interleaved), every one
asserted to change nothing. Prints each way's median and its ratio to `provision apply`'s.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import ansible_mitogen

from provisioner.audit.runner import disconnect
from provisioner.fleet.remote import Connection
from tests.lab.hosts import Lab
from tests.lab.specs import host_entry, install_standin, instance_entry, write_spec

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
# docs/ansible.md, "Ours only where you set nothing": what `provision apply` sets, as a user's ansible.cfg
TUNED_CFG = f"""[defaults]
forks = 16
interpreter_python = /usr/bin/python3
retry_files_enabled = False
strategy_plugins = {Path(ansible_mitogen.__file__).parent / "plugins" / "strategy"}
strategy = mitogen_linear

[ssh_connection]
pipelining = True
ssh_args = -o ControlMaster=auto -o ControlPersist=120s
"""


def timed(command: list, env: dict[str, str], cwd: Path) -> tuple[float, str]:
    started = time.monotonic()
    done = subprocess.run([str(part) for part in command], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=900, stdin=subprocess.DEVNULL)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"{command[0]} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-2000:]}")
    return seconds, done.stdout


def changed(output: str, host: str) -> int:
    """ansible-playbook's PLAY RECAP `changed=` of the host, or provision's summary row's changed column."""
    recap = re.search(rf"^{re.escape(host)}\s+:.*changed=(\d+)", output, re.M)
    if recap:
        return int(recap.group(1))
    row = [line for line in output.splitlines() if re.match(rf"^\W*{re.escape(host)}\W", line)][-1]
    return int(re.findall(r"\d+", row.split(host, 1)[1])[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="vp-plain-", dir="/var/tmp") as scratch, Lab() as lab:
        work = Path(scratch)
        host = lab.boot("plain0")
        install_standin(host)
        spec = write_spec(work / "spec.yml", [host_entry(host)], [instance_entry(host, "chat", 8000)])
        env = {**os.environ, "COLUMNS": "200"}
        timed([sys.executable, "-m", "provisioner.cli.main", "apply", "--spec", spec], env, ROOT)
        timed([sys.executable, "-m", "provisioner.cli.main", "inventory", "--spec", spec, "-o", work / "inv"], env, ROOT)
        timed([BIN / "ansible-galaxy", "collection", "build", "--output-path", work / "dist", ROOT], env, ROOT)
        (tarball,) = (work / "dist").glob("*.tar.gz")
        timed([BIN / "ansible-galaxy", "collection", "install", "-p", work / "collections", tarball], env, ROOT)
        plain = {key: value for key, value in env.items() if not key.startswith("ANSIBLE_")}
        (work / "empty.cfg").write_text("")
        (work / "tuned.cfg").write_text(TUNED_CFG)
        playbook = [BIN / "ansible-playbook", "-i", work / "inv" / "hosts.yml", "vllm_provision.gpu_host.site"]
        ways = {
            "provision apply": ([sys.executable, "-m", "provisioner.cli.main", "apply", "--spec", spec], env, ROOT),
            "ansible-playbook, Ansible's defaults": (playbook, {**plain, "ANSIBLE_CONFIG": str(work / "empty.cfg"),
                                                              "ANSIBLE_COLLECTIONS_PATH": str(work / "collections")}, work),
            "ansible-playbook, docs/ansible.md's settings": (playbook, {
                **plain, "ANSIBLE_CONFIG": str(work / "tuned.cfg"), "ANSIBLE_COLLECTIONS_PATH": str(work / "collections")},
                work),
        }
        seconds: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(args.repeat):
            for name, (command, environment, cwd) in ways.items():
                took, output = timed(command, environment, cwd)
                assert changed(output, host.name) == 0, f"{name} changed something:\n{output[-3000:]}"
                seconds[name].append(took)
        disconnect([Connection(host.address, "root", 22, str(host.ssh_key), str(host.known_hosts))])
    base = statistics.median(seconds["provision apply"])
    print(f"\nno-change run of the site playbook on one lab host, median of {args.repeat} (load "
          f"{' '.join(f'{load:.1f}' for load in os.getloadavg())} on {os.cpu_count()} cores):")
    for name, runs in seconds.items():
        median = statistics.median(runs)
        print(f"  {name:<46} {median:6.1f} s  {median / base:5.2f}x  ({', '.join(f'{run:.1f}' for run in runs)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
