"""Host keys: which files ssh trusts for a host, what the host presents, and whether the two agree.

Every command that connects runs ssh with strict checking (`ssh_options`): the spec's
`hosts[].ssh.known_hosts`, when given, is the only trust source for that host; without it, the user's
own known_hosts files as ssh reads them. ssh never writes a key anywhere (StrictHostKeyChecking yes,
UpdateHostKeys no). ssh's own check stays the gate; this module explains a refusal before it
happens: `check_hosts` scans each host (`ssh-keyscan`), fingerprints the keys (`ssh-keygen -lf`),
looks the host up in its trust files (`ssh-keygen -F`, which reads hashed entries and `[addr]:port`)
and says trusted, unknown or changed, with the fingerprints and the fix. `record_keys` is what
`provision trust` writes.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from provisioner.base.module_utils import value_rules

SCAN_TIMEOUT_S = 5
# Threads here (and in the audit, which imports this module: provisioner/audit/runner.py) start ssh, ssh-keyscan
# and ssh-keygen at the same time; with vfork (CPython's default on Linux) an exec now and then failed with
# "[Errno 14] Bad address: '/bin/sh'" (Python 3.11.7). fork is safe: the documented switch (gone in 3.14).
subprocess._USE_VFORK = False
# the files ssh reads when none is named, the user's first: `ssh -G` prints them as ssh_config sets them
DEFAULT_FILE_OPTIONS = ("userknownhostsfile", "globalknownhostsfile")
FINGERPRINT_LINE = re.compile(r"^\d+ (?P<fingerprint>\S+) .* \((?P<label>[^()]+)\)$")
FOUND_LINE = re.compile(r"^# Host .* found: line (?P<number>\d+)")
AUTHORITY_LINE = re.compile(r"^# Host .* found: line \d+ CA$")

TRUSTED, UNKNOWN, CHANGED, UNREACHABLE, UNCHECKED = "trusted", "unknown", "changed", "unreachable", "unchecked"
BY_AUTHORITY = "certificate authority"  # a @cert-authority line covers the host: ssh checks its certificate


class HostKeyError(RuntimeError):
    """A known_hosts file cannot be read or written; the message says which and why."""


# --------------------------------------------------------------------------- ssh's options


def ssh_options(known_hosts: str | None) -> list[str]:
    """The host-key options of every ssh we start, as `Keyword value` (for an ssh_config or `-o`).

    ssh takes the first value it sees for an option: put these before any other source of them."""
    options = []
    if known_hosts:
        options += [f"UserKnownHostsFile {_quoted(known_hosts)}", "GlobalKnownHostsFile /dev/null"]
    return options + ["StrictHostKeyChecking yes", "UpdateHostKeys no"]


def _quoted(path: str) -> str:
    """A path as one ssh_config word: in double quotes, `%` doubled (ssh expands %-tokens in it)."""
    if '"' in path:
        raise HostKeyError(f"{path}: a known_hosts path with a double quote cannot be given to ssh — rename it")
    return '"' + path.replace("%", "%%") + '"'


def known_host_name(address: str, port: int) -> str:
    """The name ssh looks the host up by: `address`, or `[address]:port` off port 22."""
    return address if port == 22 else f"[{address}]:{port}"


def trust_files(address: str, port: int, known_hosts: str | None) -> list[str]:
    """The files ssh checks this host's key against: the spec's file only, or ssh's own (user's first)."""
    if known_hosts:
        return [known_hosts]
    result = subprocess.run(["ssh", "-G", "-p", str(port), address], stdin=subprocess.DEVNULL,
                            capture_output=True, text=True, timeout=10)
    config = dict(line.partition(" ")[::2] for line in result.stdout.splitlines())
    return [name for option in DEFAULT_FILE_OPTIONS for name in config.get(option, "").split() if name != "/dev/null"]


# --------------------------------------------------------------------------- keys


@dataclass(frozen=True)
class HostKey:
    type: str  # ssh-ed25519, ecdsa-sha2-nistp256, ssh-rsa
    blob: str  # the base64 key
    fingerprint: str  # SHA256:…
    label: str  # ED25519, ECDSA, RSA (as ssh-keygen names it)

    def line(self, name: str) -> str:
        """This key as a known_hosts line for `name`."""
        return f"{name} {self.type} {self.blob}"

    def shown(self) -> str:
        return f"{self.label} {self.fingerprint}"

    @property
    def host_file(self) -> str:
        """Where the host keeps this key's public half."""
        kind = {"ssh-ed25519": "ed25519", "ssh-rsa": "rsa", "ssh-dss": "dsa"}.get(self.type, "ecdsa")
        return f"/etc/ssh/ssh_host_{kind}_key.pub"


@dataclass(frozen=True)
class RecordedKey:
    file: str
    line_number: int
    key: HostKey

    def shown(self) -> str:
        return f"{self.file} line {self.line_number} ({self.key.shown()})"


def fingerprinted(keys: list[tuple[str, str]]) -> list[HostKey]:
    """(type, base64) pairs as HostKeys, fingerprinted by `ssh-keygen -lf`."""
    if not keys:
        return []
    text = "".join(f"{kind} {blob}\n" for kind, blob in keys)
    result = subprocess.run(["ssh-keygen", "-l", "-f", "-"], input=text, capture_output=True, text=True, timeout=10)
    matches = [FINGERPRINT_LINE.match(line.strip()) for line in result.stdout.splitlines()]
    if result.returncode != 0 or len(matches) != len(keys) or not all(matches):
        raise HostKeyError(f"ssh-keygen could not fingerprint the keys: {result.stderr.strip() or result.stdout.strip()}")
    return [HostKey(kind, blob, match["fingerprint"], match["label"]) for (kind, blob), match in zip(keys, matches)]


def _key_fields(line: str) -> tuple[str, str] | None:
    """(type, base64) of a known_hosts or ssh-keyscan line; None for a marked (@revoked, @cert-authority) one."""
    fields = line.split()
    if len(fields) < 3 or fields[0].startswith("@"):
        return None
    return fields[1], fields[2]


def scan(address: str, port: int, timeout: float = SCAN_TIMEOUT_S) -> tuple[list[HostKey], str]:
    """The keys the host presents (`ssh-keyscan`), and ssh-keyscan's complaint when it got none."""
    try:
        result = subprocess.run(["ssh-keyscan", "-T", str(int(timeout)), "-p", str(port), address],
                                stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout + 10)
    except subprocess.TimeoutExpired:
        return [], f"ssh-keyscan got no answer within {timeout + 10:.0f} s"
    pairs = [fields for line in result.stdout.splitlines()
             if not line.startswith("#") and (fields := _key_fields(line))]
    complaint = "\n".join(line for line in result.stderr.splitlines() if not line.startswith("#")).strip()
    return fingerprinted(sorted(set(pairs), key=_preferred)), complaint or "the host presented no key"


def _preferred(pair: tuple[str, str]) -> tuple[int, str]:
    order = ("ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521", "ssh-rsa")
    return (order.index(pair[0]) if pair[0] in order else len(order), pair[1])


def recorded(name: str, files: list[str]) -> list[RecordedKey]:
    """The keys `files` hold for `name` (`ssh-keygen -F`: hashed entries and [addr]:port too)."""
    found: list[tuple[str, int, tuple[str, str]]] = []
    for file in files:
        if not Path(file).is_file():
            continue
        result = subprocess.run(["ssh-keygen", "-F", name, "-f", file], stdin=subprocess.DEVNULL,
                                capture_output=True, text=True, timeout=10)
        if result.returncode not in (0, 1):
            raise HostKeyError(f"{file}: ssh-keygen could not read it: {result.stderr.strip()}")
        number = 0
        for line in result.stdout.splitlines():
            if match := FOUND_LINE.match(line):
                number = int(match["number"])
            elif (fields := _key_fields(line)) is not None:
                found.append((file, number, fields))
    keys = fingerprinted([fields for _, _, fields in found])
    return [RecordedKey(file, number, key) for (file, number, _), key in zip(found, keys)]


def covered_by_authority(name: str, files: list[str]) -> bool:
    """Whether a `@cert-authority` line of `files` covers `name`: then ssh trusts the host's certificate,
    which ssh-keyscan does not fetch, so the check leaves the host to ssh."""
    for file in files:
        if Path(file).is_file():
            result = subprocess.run(["ssh-keygen", "-F", name, "-f", file], stdin=subprocess.DEVNULL,
                                    capture_output=True, text=True, timeout=10)
            if any(AUTHORITY_LINE.match(line) for line in result.stdout.splitlines()):
                return True
    return False


# --------------------------------------------------------------------------- the check


@dataclass(frozen=True)
class HostKeyCheck:
    """What one host presents against what its trust files hold."""

    host: str
    address: str
    port: int
    files: tuple[str, ...]  # the trust sources, the one `provision trust` writes first
    presented: tuple[HostKey, ...] = ()
    recorded: tuple[RecordedKey, ...] = ()
    scan_error: str = ""
    trust_command: str | None = None  # `provision trust HOST --spec SPEC`, when there is a spec
    error: str = ""  # why the check itself could not be made (a known_hosts file ssh-keygen cannot read)
    authority: bool = False  # a @cert-authority line covers the host

    @property
    def name(self) -> str:
        return known_host_name(self.address, self.port)

    @property
    def matching(self) -> list[RecordedKey]:
        presented = {(key.type, key.blob) for key in self.presented}
        return [entry for entry in self.recorded if (entry.key.type, entry.key.blob) in presented]

    @property
    def stale(self) -> list[RecordedKey]:
        """Recorded keys the host does not present: of a type it presents another key of, or any when
        none matches (ssh refuses either way, or might)."""
        presented = {(key.type, key.blob) for key in self.presented}
        types = {key.type for key in self.presented}
        matched = bool(self.matching)
        return [entry for entry in self.recorded if (entry.key.type, entry.key.blob) not in presented
                and (entry.key.type in types or not matched)]

    @property
    def status(self) -> str:
        if self.error:
            return UNCHECKED
        if not self.presented:
            return UNREACHABLE  # ssh says why, in its own words
        if self.authority and not self.matching:
            return BY_AUTHORITY  # ssh's strict check of the certificate stays the gate
        if not self.recorded:
            return UNKNOWN
        return CHANGED if self.stale else TRUSTED

    @property
    def refused(self) -> bool:
        return self.status in (UNKNOWN, CHANGED, UNCHECKED)

    @property
    def where(self) -> str:
        return f"{self.host} ({value_rules.host_port(self.address, self.port)})"

    def message(self) -> str:
        """`host (address:port): ` and the reason; '' when it is trusted or unreachable."""
        return f"{self.where}: {self.reason()}" if self.refused else ""

    def reason(self) -> str:
        """Why ssh refuses (or will refuse) this host, and the fix; '' when it is trusted or unreachable."""
        if not self.refused:
            return ""
        if self.error:
            return self.error
        shown = ", ".join(key.shown() for key in self.presented)
        first = self.presented[0]
        console = f"Check the fingerprint on the host's console (ssh-keygen -lf {first.host_file})"
        target = self.files[0] if self.files else "~/.ssh/known_hosts"
        if self.status == UNKNOWN:
            fix = f"`{self.trust_command}`" if self.trust_command else ""
            line = f"add this line to {target}: {first.line(self.name)}"
            return (f"host key not trusted — the host presents {shown}; "
                    f"{_no_key_in(self.files)}. {console}, then "
                    + (f"run {fix} (or {line})" if fix else line))
        old = "; ".join(entry.shown() for entry in self.stale)
        fix = f"run `{self.trust_command} --replace`" if self.trust_command else (
            f"remove the old key (ssh-keygen -R '{self.name}' -f {self.stale[0].file}) and add this line to "
            f"{self.stale[0].file}: {first.line(self.name)}")
        return (f"HOST KEY CHANGED — the host presents {shown}, but {old} holds another key for it. "
                "This may be an attack (someone between you and the host), or the host got new keys "
                f"(reinstalled). Nothing was sent to it. {console}; only if it matches, {fix}")


def _no_key_in(files: tuple[str, ...]) -> str:
    if not files:
        return "ssh reads no known_hosts file"
    return f"{files[0]} has no key for it" if len(files) == 1 else f"none of {', '.join(files)} has a key for it"


def check_host(host: str, address: str, port: int, known_hosts: str | None,
               trust_command: str | None = None) -> HostKeyCheck:
    """Scan the host and compare with its trust files (a file that cannot be read refuses the host)."""
    files = tuple(trust_files(address, port, known_hosts))
    try:
        presented, complaint = scan(address, port)
        found = recorded(known_host_name(address, port), list(files))
    except HostKeyError as error:
        return HostKeyCheck(host, address, port, files, trust_command=trust_command, error=str(error))
    return HostKeyCheck(host, address, port, files, tuple(presented), tuple(found),
                        "" if presented else complaint, trust_command,
                        authority=covered_by_authority(known_host_name(address, port), list(files)))


@dataclass(frozen=True)
class Endpoint:
    """One host to check: its name (for messages), how ssh reaches it, its spec's known_hosts file."""

    host: str
    address: str
    port: int = 22
    known_hosts: str | None = None
    trust_command: str | None = None


def check_hosts(endpoints: list[Endpoint]) -> dict[str, HostKeyCheck]:
    """`check_host` for every endpoint, all at once."""
    if not endpoints:
        return {}
    with ThreadPoolExecutor(max_workers=len(endpoints)) as pool:
        checks = pool.map(lambda e: check_host(e.host, e.address, e.port, e.known_hosts, e.trust_command), endpoints)
        return {check.host: check for check in checks}


def trust_command(spec_path: str | Path | None, host: str) -> str | None:
    return f"provision trust {host} --spec {shlex.quote(str(spec_path))}" if spec_path else None


def explain_refusal(ssh_stderr: str, endpoint: Endpoint) -> str | None:
    """When ssh refused a host key: why, with the fingerprints and the fix; None for other failures."""
    if "Host key verification failed" not in ssh_stderr:
        return None
    check = check_host(endpoint.host, endpoint.address, endpoint.port, endpoint.known_hosts, endpoint.trust_command)
    return check.message() or None


# --------------------------------------------------------------------------- provision trust


@dataclass
class Recorded:
    """What `record_keys` did."""

    file: str
    added: list[str] = field(default_factory=list)  # the lines written
    removed: list[RecordedKey] = field(default_factory=list)


def trust_problem(check: HostKeyCheck, replace: bool = False) -> str | None:
    """Why the host's keys cannot be recorded (with `replace` or not); None when they can."""
    if check.error:
        return check.message()
    if check.status == UNREACHABLE:
        return f"{check.where}: no host key could be read — {check.scan_error}"
    if not check.files:
        return f"{check.where}: ssh names no known_hosts file to write — set hosts[].ssh.known_hosts"
    if check.status == CHANGED:
        if not replace:
            return check.message() + " — nothing written"
        elsewhere = sorted({entry.file for entry in check.stale if entry.file != check.files[0]})
        if elsewhere:
            return (f"{check.where}: the old key is in {', '.join(elsewhere)}, which ssh also reads — remove it "
                    f"there (ssh-keygen -R '{check.name}' -f FILE), then trust the host again")
    return None


def record_keys(check: HostKeyCheck, replace: bool = False) -> Recorded:
    """Write the keys the host presents to its first trust file (the spec's, or the user's own);
    a different recorded key only with `replace` (its lines go first, `ssh-keygen -R`). A trusted
    host: nothing is written."""
    if problem := trust_problem(check, replace):
        raise HostKeyError(problem)
    file = check.files[0]
    if check.status == TRUSTED:
        return Recorded(file)
    if check.status == CHANGED:
        result = subprocess.run(["ssh-keygen", "-R", check.name, "-f", file], stdin=subprocess.DEVNULL,
                                capture_output=True, text=True, timeout=10)
        if result.returncode != 0:
            raise HostKeyError(f"{file}: ssh-keygen -R could not remove the old key: {result.stderr.strip()}")
        Path(file + ".old").unlink(missing_ok=True)  # ssh-keygen's backup: it holds the key we distrust
    lines = [key.line(check.name) for key in check.presented]
    path = Path(file)
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        text = path.read_text(encoding="utf-8") if path.exists() else ""
        with path.open("a", encoding="utf-8") as out:
            out.write(("\n" if text and not text.endswith("\n") else "") + "".join(line + "\n" for line in lines))
    except OSError as error:
        raise HostKeyError(f"{file}: cannot write it: {error.strerror}") from None
    return Recorded(file, lines, list(check.stale) if check.status == CHANGED else [])
