"""Faults on real systemd test hosts (systemd-nspawn, over SSH), as a bastion meets them: a host that goes
silent mid-apply and mid-audit (its link taken down: no answer, no reset), a key the host does not accept
while an ssh master of an earlier run is still open, and two applies of one host at once (two team members,
each with a spec of their own), one of them killed.

Two hosts serve the module, in file order: both applied; the second goes silent mid-apply, then is back
and the rerun converges; the second goes silent before a warm audit; a run with a key the host refuses; an
apply refused, then waiting, while another holds the first host; a killed apply's lock taken over.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from provisioner.base.paths import collections_dir, site_playbook
from tests.lab.specs import host_entry, install_standin, instance_entry, write_spec
from tests.lab.terminal import as_from_a_terminal

PROVISION = [sys.executable, "-m", "provisioner.cli.main"]
NAMED_WITHIN_S = 30  # issue 33: a lost host is named within 30 s


def provision(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run provision with a stdin of its own, which it must leave as it found it whatever the fault: an ssh
    killed mid-session leaves its stdin non-blocking, and so a user's terminal, and every Ansible after it
    ("Ansible requires blocking IO on stdin")."""
    with open(os.devnull) as stdin:
        done = subprocess.run([*PROVISION, *args], stdin=stdin, capture_output=True, text=True, timeout=600,
                              env={**os.environ, **(env or {})})
        assert os.get_blocking(stdin.fileno()), f"provision {args[0]} left its stdin non-blocking"
    return done


def spec_of(folder: Path, hosts, share: float, name: str = "spec.yml", **ssh) -> Path:
    entries = [host_entry(host) for host in hosts]
    for entry in entries:
        entry["ssh"].update(ssh)
    return write_spec(folder / name, entries, [instance_entry(host, f"chat-{host.name}", 8000, share=share)
                                               for host in hosts])


@pytest.fixture(scope="module")
def pair(lab, tmp_path_factory):
    hosts = lab.boot_many([f"fa{lab.boot_count}", f"fa{lab.boot_count + 1}"])
    for host in hosts:
        install_standin(host)
    folder = tmp_path_factory.mktemp("faults")
    first = provision("apply", "--spec", str(spec_of(folder, hosts, 0.45)))
    assert first.returncode == 0, first.stdout[-3000:]
    yield hosts, folder
    for host in hosts:
        lab.set_link(host, up=True)
        lab.destroy(host)


def run_with_fault(command: list[str], at: tuple[str, ...], fault, named: tuple[str, ...]) -> tuple[int, str, dict]:
    """Run `command`; once a line of its output has all of `at`, call `fault`. (exit code, output, seconds:
    from the start to the fault, from the fault to the first line with all of `named`, and to the end)."""
    started = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines, cut, said = [], None, None
    for line in process.stdout:
        lines.append(line)
        if cut is None and all(word in line for word in at):
            cut = time.monotonic()
            fault()
        if cut is not None and said is None and all(word in line for word in named):
            said = time.monotonic()
    rc = process.wait(timeout=600)
    output = "".join(lines)
    assert cut is not None and said is not None, output[-3000:]
    return rc, output, {"fault": cut - started, "named": said - cut, "ended": time.monotonic() - cut}


def test_a_host_silent_mid_apply_is_named_lost_within_30_s_the_other_finishes_and_the_rerun_converges(lab, pair):
    hosts, folder = pair
    silent = hosts[1]
    spec = spec_of(folder, hosts, 0.5, "changed.yml")
    # the second host goes silent as its instances' role starts in the hosts' play (the first host's finishes the
    # same way); its first task, not the role's secrets check of the lock play, which comes before the lock
    try:
        rc, output, seconds = run_with_fault([*PROVISION, "apply", "--spec", str(spec)],
                                             (silent.name, "vllm_service : Check the timeouts"),
                                             lambda: lab.set_link(silent, up=False), ("unreachable", silent.name))
    finally:
        lab.set_link(silent, up=True)
    print(f"\n{silent.name} silent {seconds['fault']:.1f} s into the apply: named unreachable {seconds['named']:.1f} s "
          f"later, the apply ended {seconds['ended']:.1f} s later (rc {rc})")
    assert rc == 1, output[-3000:]
    assert seconds["named"] < NAMED_WITHIN_S, output[-3000:]
    summary = output[output.rindex("apply\n"):]
    assert f"{silent.name}: vllm_service : " in summary, summary  # the step it was on
    assert "the connection closed while a task ran" in summary or "stopped answering" in summary, summary
    # what the network says now: a connection sent into the void, or no route once its address is forgotten
    assert "connected to again: no answer on the ssh port" in summary or "connected to again: no route" in summary, summary
    assert "file a bug" not in output and "Mitogen" not in output, output[-3000:]
    assert hosts[0].ssh(f"grep -c 0.5 /etc/vllm/chat-{hosts[0].name}.yaml", check=False).stdout.strip() == "1"
    assert hosts[0].ssh(f"systemctl is-active vllm-chat-{hosts[0].name}.service").stdout.strip() == "active"

    rerun = provision("apply", "--spec", str(spec))
    assert rerun.returncode == 0, rerun.stdout[-3000:]
    assert silent.ssh(f"systemctl is-active vllm-chat-{silent.name}.service").stdout.strip() == "active"


def test_an_audit_of_a_host_silent_since_the_last_audit_says_so_within_30_s(lab, pair):
    hosts, folder = pair
    spec = str(folder / "changed.yml")
    warm = provision("audit", "spec", "--spec", spec)
    assert warm.returncode == 0, warm.stdout[-3000:]
    lab.set_link(hosts[1], up=False)
    started = time.monotonic()
    try:
        audit = provision("audit", "spec", "--spec", spec)
    finally:
        took = time.monotonic() - started
        lab.set_link(hosts[1], up=True)
    print(f"\nthe audit with {hosts[1].name} silent took {took:.1f} s (rc {audit.returncode})")
    assert audit.returncode == 2 and took < NAMED_WITHIN_S, audit.stdout[-3000:]
    lines = {line.split(" ")[0]: line for line in audit.stdout.splitlines() if line.startswith(("fa",))}
    assert "passed" in lines[hosts[0].name], audit.stdout
    assert "could not run: " in lines[hosts[1].name], audit.stdout
    assert "no route to the host" in lines[hosts[1].name] or "no answer on the ssh port" in lines[hosts[1].name], audit.stdout
    assert "CommandResult" not in audit.stdout


def test_a_key_the_host_refuses_is_refused_though_an_earlier_runs_master_is_open(pair, tmp_path):
    """Ansible's own strategy (Ansible names its ssh master after host, port and user only): a run with the
    right key leaves its master open (ControlPersist); the next, with a key the host does not accept, must
    authenticate afresh. No instance: nothing reads the driver first, Ansible makes the first connection."""
    hosts, folder = pair
    host = hosts[0]
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    linear = {"ANSIBLE_STRATEGY": "linear"}
    right = write_spec(tmp_path / "right.yml", [host_entry(host)], [])
    wrong_entry = host_entry(host)
    wrong_entry["ssh"]["key"] = str(other)
    wrong = write_spec(tmp_path / "wrong.yml", [wrong_entry], [])
    opened = provision("apply", "--spec", str(right), "--check", env=linear)
    assert opened.returncode == 0, opened.stdout[-3000:]
    refused = provision("apply", "--spec", str(wrong), "--check", env=linear)
    print(f"\n{refused.stdout[-1500:]}")
    assert refused.returncode == 1, refused.stdout[-3000:]
    assert f"{host.name}: " in refused.stdout and "authentication refused" in refused.stdout, refused.stdout[-3000:]


LOCK = "/var/lib/vllm-provision/apply.lock"


def lock_holder(host) -> dict | None:
    text = host.ssh(f"cat {LOCK}", check=False).stdout.strip()
    return json.loads(text) if text else None


def start_apply(spec: Path) -> subprocess.Popen:
    """An apply in a process group of its own, its output in <spec>.out."""
    with open(spec.with_suffix(".out"), "w") as output:
        return subprocess.Popen([*PROVISION, "apply", "--spec", str(spec)], stdout=output, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)


def output_of(spec: Path) -> str:
    return spec.with_suffix(".out").read_text()[-3000:]


def wait_for_lock(host, process: subprocess.Popen, spec: Path) -> dict:
    """The lock's record on `host` once the apply `process` of `spec` took it."""
    deadline = time.monotonic() + 120
    while (holder := lock_holder(host)) is None:
        assert process.poll() is None and time.monotonic() < deadline, output_of(spec)
        time.sleep(0.2)
    return holder


def test_a_second_apply_of_a_host_is_refused_naming_the_first_then_waits_for_it(pair, tmp_path):
    """Two specs (two team members) name the same host: the second apply is refused while the first runs, saying
    who holds the host; with --wait-lock it waits, then runs. Each changes the instance: the first's restart is
    never cut by the second's."""
    hosts, _folder = pair
    host = hosts[0]
    alice = spec_of(tmp_path, [host], 0.4, "alice.yml")
    first = start_apply(alice)
    holder = wait_for_lock(host, first, alice)
    bob = spec_of(tmp_path, [host], 0.45, "bob.yml")
    started = time.monotonic()
    refused = provision("apply", "--spec", str(bob))
    refused_in = time.monotonic() - started
    print(f"\nrefused in {refused_in:.1f} s:\n{refused.stdout[-1200:]}")
    assert refused.returncode == 1, refused.stdout[-3000:]
    assert (f"another apply holds this host: {holder['user']} from {holder['controller']} (pid {holder['pid']}), "
            "since ") in refused.stdout and "--wait-lock SECONDS" in refused.stdout, refused.stdout[-3000:]
    assert first.poll() is None, "the refused apply outlived the first: the refusal proves nothing"
    waited = provision("apply", "--spec", str(bob), "--wait-lock", "300")
    assert first.wait(timeout=300) == 0, output_of(alice)
    assert waited.returncode == 0, waited.stdout[-3000:]
    assert host.ssh(f"grep -c 0.45 /etc/vllm/chat-{host.name}.yaml", check=False).stdout.strip() == "1"
    journal = host.ssh(f"journalctl -u vllm-chat-{host.name}.service --no-pager", check=False).stdout
    assert "code=killed" not in journal, journal[-3000:]
    assert lock_holder(host) is None  # given back


def test_the_lock_of_a_killed_apply_is_taken_over_by_the_next_from_the_same_controller(pair, tmp_path):
    hosts, _folder = pair
    host = hosts[0]
    spec = spec_of(tmp_path, [host], 0.4, "killed.yml")
    killed = start_apply(spec)
    holder = wait_for_lock(host, killed, spec)
    playbook = playbook_of(killed)
    assert holder["pid"] == playbook  # the run is its ansible-playbook process
    os.killpg(killed.pid, signal.SIGKILL)  # provision: nothing gives the lock back
    killed.wait()
    deadline = time.monotonic() + 60  # its ansible-playbook, in a session of its own, ends with it (SIGINT)
    while Path(f"/proc/{playbook}").exists():
        assert time.monotonic() < deadline, f"ansible-playbook {playbook} outlived the provision that ran it"
        time.sleep(0.2)
    assert lock_holder(host)["pid"] == holder["pid"]
    started = time.monotonic()
    rerun = provision("apply", "--spec", str(spec))
    print(f"\nthe next apply took {time.monotonic() - started:.1f} s:\n{rerun.stdout[-1500:]}")
    assert rerun.returncode == 0, rerun.stdout[-3000:]
    assert (f"took over the apply lock of {holder['user']} from {holder['controller']} (pid {holder['pid']})"
            in rerun.stdout and "that run is gone" in rerun.stdout), rerun.stdout[-3000:]
    assert lock_holder(host) is None


def interrupt_apply(spec: Path, at: tuple[str, ...], send) -> tuple[int, str, float]:
    """Run an apply as a terminal runs it (a process group of its own); once a line of its output has all of
    `at`, `send(process)` interrupts it. (exit code, output, seconds from the signal to the end)."""
    process = subprocess.Popen([*PROVISION, "apply", "--spec", str(spec)], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True,
                               preexec_fn=as_from_a_terminal)
    lines, sent = [], None
    for line in process.stdout:
        lines.append(line)
        if sent is None and all(word in line for word in at):
            sent = time.monotonic()
            send(process)
    rc = process.wait(timeout=300)
    output = "".join(lines)
    assert sent is not None, output[-3000:]
    return rc, output, time.monotonic() - sent


def summary_of(output: str) -> str:
    return output[output.rindex("apply\n"):]


def playbook_of(process: subprocess.Popen) -> int:
    """The ansible-playbook that `provision apply` (process) runs, in a session of its own."""
    found = subprocess.run(["pgrep", "-P", str(process.pid), "-f", "ansible-playbook"], capture_output=True, text=True)
    return int(found.stdout.split()[0])


def test_interrupts_stop_between_tasks_and_say_how_far_each_host_got_and_the_rerun_converges(lab, pair, tmp_path):
    """Ctrl-C (SIGINT to the terminal's process group) while the instances change, SIGTERM to provision alone,
    and SIGINT to ansible-playbook alone: each exits 130 and says how far each host got; the first two stop
    before a task, never in one (nor between a config change and its restart); the run log records it; the
    rerun converges."""
    hosts, _folder = pair
    spec = spec_of(tmp_path, hosts, 0.55, "interrupted.yml")
    rc, output, took = interrupt_apply(spec, (hosts[0].name, "vllm_service : Write the config files"),
                                       lambda process: os.killpg(process.pid, signal.SIGINT))
    print(f"\nCtrl-C: stopped {took:.1f} s after the signal (rc {rc}):\n{summary_of(output)}")
    assert rc == 130, output[-3000:]
    assert "Ctrl-C: stopping before the next task" in output, output[-3000:]
    assert "interrupted (Ctrl-C): stopped before `" in output and "no task cut" in output, output[-3000:]
    for host in hosts:
        assert f"  {host.name}: " in output and "vllm_service : Write the config files" in output, output[-3000:]
    # the signal came as the config changed: its restart (a handler) still ran before the stop
    assert any(hosts[0].name in line and "changed" in line and "Restart the changed instances" in line
               for line in output.splitlines()), output[-3000:]
    log = Path(output.rsplit("run log: ", 1)[1].split()[0]).read_text()
    assert "interrupted (Ctrl-C)" in log

    rc, output, took = interrupt_apply(spec, (hosts[1].name, "sysctl : "),
                                       lambda process: process.send_signal(signal.SIGTERM))
    print(f"\nSIGTERM: stopped {took:.1f} s after the signal (rc {rc}):\n{summary_of(output)}")
    assert rc == 130 and "interrupted (SIGTERM): stopped before `" in output, output[-3000:]

    rc, output, took = interrupt_apply(spec, (hosts[1].name, "sysctl : "),
                                       lambda process: os.kill(playbook_of(process), signal.SIGINT))
    print(f"\nSIGINT to ansible-playbook: ended {took:.1f} s after the signal (rc {rc}):\n{summary_of(output)}")
    assert rc == 130 and "interrupted (a signal to ansible-playbook)" in output, output[-3000:]
    assert "before running any task" not in output and f"  {hosts[1].name}: " in output, output[-3000:]

    rerun = provision("apply", "--spec", str(spec))
    assert rerun.returncode == 0, rerun.stdout[-3000:]
    for host in hosts:
        assert host.ssh(f"grep -c 0.55 /etc/vllm/chat-{host.name}.yaml", check=False).stdout.strip() == "1"
        assert host.ssh(f"systemctl is-active vllm-chat-{host.name}.service").stdout.strip() == "active"


def served_share(host) -> float:
    """The gpu_memory_utilization the instance's running process serves with (the TEST DOUBLE's /standin/process)."""
    with urllib.request.urlopen(f"http://{host.address}:8000/standin/process", timeout=5) as response:
        return json.load(response)["options"]["gpu_memory_utilization"]


def test_a_config_a_stopped_run_wrote_but_did_not_restart_is_restarted_by_the_next(pair, tmp_path):
    """The state a run leaves when it is killed, or loses the host, between writing an instance's config and
    restarting it: the file has the new setting, the process runs the old one. The next apply has no file to
    write (the file is right already) and must still restart it; the one after changes nothing."""
    hosts, _folder = pair
    host = hosts[0]
    config = f"/etc/vllm/chat-{host.name}.yaml"
    new, old = spec_of(tmp_path, [host], 0.6, "new.yml"), spec_of(tmp_path, [host], 0.35, "old.yml")
    assert provision("apply", "--spec", str(new)).returncode == 0
    written = host.ssh(f"base64 -w0 {config}").stdout.strip()
    assert provision("apply", "--spec", str(old)).returncode == 0
    # the stopped run's write: the new file over the old one (owner and mode kept), no restart
    host.ssh(f"echo {written} | base64 -d > {config}")
    assert served_share(host) == 0.35
    rerun = provision("apply", "--spec", str(new), "--json")
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert json.loads(rerun.stdout)["hosts"][host.name]["changed"] >= 1, rerun.stderr[-3000:]
    assert served_share(host) == 0.6  # restarted
    again = provision("apply", "--spec", str(new), "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["hosts"][host.name]["changed"] == 0, again.stderr[-3000:]


def test_plain_ansible_is_refused_while_an_apply_holds_the_host_and_waits_with_apply_lock_wait(pair, tmp_path):
    """The lock is the playbook's: ansible-playbook from a bastion (no provision, no checkout's ansible.cfg) is
    refused, naming the apply that holds the host, and with -e apply_lock_wait=SECONDS waits for it."""
    hosts, _folder = pair
    host = hosts[0]
    spec = spec_of(tmp_path, [host], 0.4, "team.yml")
    made = provision("inventory", "--spec", str(spec), "-o", str(tmp_path / "inventory"))
    assert made.returncode == 0, made.stdout + made.stderr
    environment = {key: value for key, value in os.environ.items() if not key.startswith("ANSIBLE_")}
    plain = [str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(tmp_path / "inventory" / "hosts.yml"),
             site_playbook(), "--check"]
    env = {**environment, "ANSIBLE_COLLECTIONS_PATH": str(collections_dir(tmp_path / "collections")),
           "ANSIBLE_FORCE_COLOR": "0"}
    running = start_apply(spec)
    holder = wait_for_lock(host, running, spec)
    refused = subprocess.run(plain, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env,
                             stdin=subprocess.DEVNULL)
    assert refused.returncode != 0, refused.stdout[-3000:]
    assert (f"another apply holds this host: {holder['user']} from {holder['controller']} (pid {holder['pid']})"
            in refused.stdout), refused.stdout[-3000:]
    assert running.poll() is None, "the apply ended before the refusal: it proves nothing"
    waited = subprocess.run([*plain, "-e", "apply_lock_wait=300"], capture_output=True, text=True, timeout=600,
                            cwd=tmp_path, env=env, stdin=subprocess.DEVNULL)
    assert running.wait(timeout=300) == 0, output_of(spec)
    assert waited.returncode == 0, waited.stdout[-3000:]
