# SPDX-License-Identifier: Apache-2.0
# Part of vllm-provision. Shared by the spec (provisioner/spec), the roles' preflights (plugins/test/value_rules.py)
# and the audit: standard library only.
"""One rule per kind of value: sizes, durations, ports, addresses, names, versions, files, SLO limits.

Each rule is a function `<kind>_problem(value) -> str | None`: None where the value is good, else what is
wrong and how to fix it, without the field's name (the caller knows where the value came from). Where a
value is turned into something else (a size into bytes, a duration into milliseconds, an address and a port
into `host:port`) the function that does it is here too, beside its rule.

Every rule is ASCII (a Unicode digit such as '١' is not a digit to systemd, mount or Prometheus), anchored
at both ends (re.fullmatch: no trailing newline slips through `$`) and bounded (no 40-digit number reaches a
file). tests/unit/test_value_rules.py checks each one against its consumer's own parser where one is installed
(promtool, systemd-analyze).
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
import stat

# --------------------------------------------------------------------------- sizes

# /dev/shm's and a container's --shm-size: a whole number of K, M, G or T (binary units), as mount(8)'s
# tmpfs size= and docker/podman take them
SIZE_PATTERN = r"^[1-9][0-9]*[KMGT]$"
SIZE_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
MAX_SIZE_BYTES = 1 << 50  # 1024T: far above any host's memory, far below what a 64-bit count holds
SIZE_FIX = "write a number with a K, M, G or T suffix (e.g. 16G)"


def size_bytes(value: str) -> int:
    """'16G' → 17179869184; ValueError where size_problem finds one."""
    problem = size_problem(value)
    if problem:
        raise ValueError(problem)
    return int(value[:-1]) * SIZE_UNITS[value[-1]]


def size_problem(value: object) -> str | None:
    if not isinstance(value, str) or not re.fullmatch(SIZE_PATTERN, value, re.ASCII):
        return f"{value!r} is not a size — {SIZE_FIX}"
    if len(value) > 20 or int(value[:-1]) * SIZE_UNITS[value[-1]] > MAX_SIZE_BYTES:
        return f"{value!r} is larger than 1024T — {SIZE_FIX}"
    return None


# --------------------------------------------------------------------------- durations

# Prometheus's duration grammar (prometheus/common model.ParseDuration): units from the largest down, each at
# most once, without spaces: 1m30s, 1h, 500ms. systemd's timers read the same text (systemd.time(7)).
DURATION_PATTERN = r"^([0-9]+y)?([0-9]+w)?([0-9]+d)?([0-9]+h)?([0-9]+m)?([0-9]+s)?([0-9]+ms)?$"
DURATION_UNITS_MS = {"y": 365 * 86_400_000, "w": 7 * 86_400_000, "d": 86_400_000, "h": 3_600_000, "m": 60_000,
                     "s": 1000, "ms": 1}
MAX_DURATION_MS = 365 * 86_400_000  # a year: every interval of ours is far shorter
DURATION_FIX = "write a whole number and a unit, larger units first, as Prometheus does (e.g. 15s, 5m, 1m30s)"


def duration_ms(value: str) -> int:
    """'1m30s' → 90000; ValueError where duration_problem finds one."""
    problem = duration_problem(value)
    if problem:
        raise ValueError(problem)
    return _milliseconds(value)


def _milliseconds(value: str) -> int:
    return sum(int(number) * DURATION_UNITS_MS[unit] for number, unit in re.findall(r"([0-9]+)(ms|[ywdhms])", value))


def duration_problem(value: object) -> str | None:
    if not isinstance(value, str) or not value or not re.fullmatch(DURATION_PATTERN, value, re.ASCII):
        return f"{value!r} is not a duration — {DURATION_FIX}"
    if len(value) > 32 or _milliseconds(value) > MAX_DURATION_MS:
        return f"{value!r} is longer than a year — {DURATION_FIX}"
    if _milliseconds(value) == 0:
        return f"{value!r} is no time at all — {DURATION_FIX}"
    return None


# --------------------------------------------------------------------------- ports

def port_problem(value: object) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        return f"{value!r} is not a port — use a whole number from 1 to 65535"
    return None


# --------------------------------------------------------------------------- addresses

HOSTNAME_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*$"


def address_problem(value: object) -> str | None:
    """An IPv4 or IPv6 address (without a zone id) or a DNS host name."""
    if not isinstance(value, str) or not value.isascii():
        return f"{value!r} is neither an IP address nor a host name"
    if "%" in value:
        return (f"{value!r} has a zone id (%…), which host:port and the files that hold it cannot carry — use a "
                "global or unique-local address, or a host name")
    if ":" in value:
        try:
            ipaddress.IPv6Address(value)
        except ValueError:
            return f"{value!r} is not an IPv6 address — write it without brackets or port (e.g. 2001:db8::11)"
        return None
    if len(value) > 253 or not re.fullmatch(HOSTNAME_PATTERN, value, re.ASCII) \
            or any(len(label) > 63 for label in value.split(".")):
        return f"{value!r} is neither an IP address nor a host name"
    return None


def bracketed(address: str) -> str:
    """An address as it goes before :port — an IPv6 address in brackets."""
    return f"[{address}]" if ":" in address and not address.startswith("[") else address


def host_port(address: str, port: int) -> str:
    """'2001:db8::11', 9100 → '[2001:db8::11]:9100'; '10.0.0.5', 9100 → '10.0.0.5:9100'."""
    return f"{bracketed(address)}:{port}"


# what the roles' templates write addresses with (plugins/filter/value_rules.py:
# `address | vllm_provision.gpu_host.host_port(port)`; provision plan's plain Jinja2 registers them by the same names)
FILTERS = {"host_port": host_port, "bracketed": bracketed}


# --------------------------------------------------------------------------- names

NAME_PATTERN = r"^[a-z0-9][a-z0-9-]*$"  # a host's or an instance's name, lowercase (its length: cross_checks)
GPU_UUID_PATTERN = r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"


def name_problem(value: object) -> str | None:
    if not isinstance(value, str) or not re.fullmatch(NAME_PATTERN, value, re.ASCII):
        return (f"{value!r} is not a valid name — use lowercase letters, digits and dashes, starting with a letter "
                "or digit (e.g. qwen7b, ws-3090)")
    return None


def gpu_uuid_problem(value: object) -> str | None:
    if not isinstance(value, str) or not re.fullmatch(GPU_UUID_PATTERN, value, re.ASCII):
        return (f"{value!r} is not a GPU UUID — expected GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx (lowercase hex) "
                "as printed by `nvidia-smi -L`")
    return None


# --------------------------------------------------------------------------- versions

# vLLM's version as pip writes it (PEP 440's release, pre/post/dev parts and a local label: 0.25.0, 0.25.0+cu129)
VLLM_VERSION_PATTERN = r"^[0-9]+(\.[0-9]+)*((a|b|rc|\.post|\.dev)[0-9]+)*(\+[a-z0-9]+(\.[a-z0-9]+)*)?$"
# an NVIDIA driver's branch (the number before the first dot: 580) and a version as nvidia-smi prints it
DRIVER_BRANCH_PATTERN = r"^[1-9][0-9]{2,3}$"
DRIVER_VERSION_PATTERN = r"^[1-9][0-9]{2,3}\.[0-9]+(\.[0-9]+)?$"  # 580.95.05, 550.120
# nvidia-container-toolkit's Debian package version, as apt shows it: 1.18.0-1, 1.18.0~rc.1-1
TOOLKIT_VERSION_PATTERN = r"^[0-9]+\.[0-9]+\.[0-9]+(~rc\.[0-9]+)?-[0-9]+$"


def _matches(pattern: str, value: object, longest: int = 64) -> bool:
    return isinstance(value, str) and len(value) <= longest and re.fullmatch(pattern, value, re.ASCII) is not None


def vllm_version_problem(value: object) -> str | None:
    if not _matches(VLLM_VERSION_PATTERN, value):
        return (f"{value!r} is not a version — write it as pip does, quoted: \"0.25.0\" (\"0.25.0+cu129\": its CUDA "
                "12.9 build)")
    return None


def driver_branch_problem(value: object) -> str | None:
    if not _matches(DRIVER_BRANCH_PATTERN, value):
        return (f"{value!r} is not a driver branch — write the number before the first dot of a driver version, "
                'quoted (e.g. "580")')
    return None


def driver_version_problem(value: object, branch: str | None = None) -> str | None:
    """A driver version as nvidia-smi prints it; with `branch`, one of that branch (580.95.05 is of 580)."""
    if not _matches(DRIVER_VERSION_PATTERN, value):
        return f'{value!r} is not a driver version — write it as nvidia-smi prints it, quoted (e.g. "580.95.05")'
    if branch is not None and value.split(".")[0] != str(branch):
        return f"{value} is not of branch {branch} — give a version of that branch ({branch}.x)"
    return None


def toolkit_version_problem(value: object) -> str | None:
    if not _matches(TOOLKIT_VERSION_PATTERN, value):
        return (f"{value!r} is not a version of NVIDIA's toolkit package — write it as apt shows it, quoted "
                '(e.g. "1.18.0-1")')
    return None


# --------------------------------------------------------------------------- files

MAX_SMALL_FILE_BYTES = 64 << 10  # a key, a known_hosts file, an API key: far smaller


def file_problem(path: str, what: str, max_bytes: int | None = MAX_SMALL_FILE_BYTES,
                 may_be_empty: bool = False) -> str | None:
    """A file the spec names, on the controller: there, a regular file (not a folder, a FIFO or a device such
    as /dev/zero, which a read would hang on or never finish), readable, not empty unless `may_be_empty`, at
    most `max_bytes` (None: any size). Never opens it: os.stat only. `what`: what it holds, for the fix."""
    try:
        status = os.stat(path)
    except FileNotFoundError:
        return f"{path} does not exist — create it with {what} or correct the path"
    except OSError as error:
        return f"{path} cannot be read ({error.strerror}) — make it readable, or correct the path"
    if stat.S_ISDIR(status.st_mode):
        return f"{path} is a folder, not a file — name the file that holds {what}"
    if not stat.S_ISREG(status.st_mode):
        return f"{path} is not a regular file (a device, a FIFO or a socket) — name a plain file that holds {what}"
    if not os.access(path, os.R_OK):
        return f"{path} is not readable by this user — make it readable (chmod u+r), or correct the path"
    if max_bytes is not None and status.st_size > max_bytes:
        return f"{path} is {status.st_size} bytes, more than {what} takes (at most {max_bytes}) — name the right file"
    if status.st_size == 0 and not may_be_empty:
        return f"{path} is empty — put {what} in it"
    return None


def read_small_file(path: str, max_bytes: int = MAX_SMALL_FILE_BYTES) -> bytes:
    """A regular file's bytes, at most `max_bytes`: never blocks (O_NONBLOCK: a FIFO opens at once, and is
    refused as not regular), never reads past the bound. OSError otherwise (file_problem says which)."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise OSError(f"{path} is not a regular file")
        content = b""
        while len(content) <= max_bytes:
            chunk = os.read(descriptor, max_bytes + 1 - len(content))
            if not chunk:
                return content
            content += chunk
        raise OSError(f"{path} is larger than {max_bytes} bytes")
    finally:
        os.close(descriptor)


# --------------------------------------------------------------------------- SLO limits

MAX_LATENCY_MS = 3_600_000  # an hour: no latency objective of an inference server is longer


def latency_limit_problem(value: object) -> str | None:
    """A latency objective in milliseconds: a finite number above 0, at most an hour."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or not 0 < value <= MAX_LATENCY_MS:
        return f"{value!r} is not a latency limit — give milliseconds above 0, at most {MAX_LATENCY_MS} (an hour)"
    return None


def share_limit_problem(value: object) -> str | None:
    """A share of requests in percent: a finite number above 0, at most 100."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0 < value <= 100:
        return f"{value!r} is not a share — give a percentage above 0, at most 100"
    return None
