# SPDX-License-Identifier: Apache-2.0
"""A host's NVIDIA GPU facts, read through NVML or, without it, from `nvidia-smi`.

One copy, two users: the Ansible module `nvidia_gpu` (Ansible ships this file
with it to the target) and the provisioner package (`provisioner.gpu.nvml` and
`provisioner.gpu.smi` load it from here). So: Python standard library only, and
pynvml (nvidia-ml-py) imported by `LiveNvml` alone, the one place that talks to
the driver through NVML.

The NVML seam. A backend answers `call(function, *labels)`: an NVML function name
and its arguments written as labels, exactly as tests/fixtures/gpu/record_nvml.py
records them ("nvmlDeviceGetClockInfo(0,SM)"): device indexes ("0"), clock domains
("GRAPHICS", "SM", "MEM"), the temperature sensor ("GPU"), P2P capabilities
("READ", "WRITE", "NVLINK", "ATOMICS"). It returns the value as plain JSON data
(NVML structs as dicts) or raises `NvmlCallError`. `LiveNvml` asks the driver,
`ReplayNvml` reads a recording, and `read_nvml_facts` builds the facts from
either: CI runs the same code on recorded answers.

The facts are plain data (see `read_nvml_facts`); `read_smi_facts` builds the same
shape from `nvidia-smi --query-gpu=... --format=csv` and `nvidia-smi topo`.
"""

from __future__ import annotations

import csv
import json
import re

# --------------------------------------------------------------------------- shared vocabulary

# nvmlClocksEventReason* bits (nvml.h), by the names nvidia-smi gives them.
CLOCK_EVENT_REASONS = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
    (0x200, "board_limit"),
    (0x400, "reliability"),
)

# nvmlGpuP2PStatus_t values, and the codes `nvidia-smi topo -p2p` prints for them.
P2P_STATUSES = {
    0: "ok",
    1: "chipset_not_supported",
    2: "gpu_not_supported",
    3: "topology_not_supported",
    4: "disabled_by_regkey",
    5: "not_supported",
    6: "unknown",
}
SMI_P2P_CODES = {
    "OK": "ok",
    "CNS": "chipset_not_supported",
    "GNS": "gpu_not_supported",
    "TNS": "topology_not_supported",
    "DR": "disabled_by_regkey",
    "NS": "not_supported",
    "U": "unknown",
}

# nvmlGpuTopologyLevel_t: the closest common PCIe ancestor of two GPUs, named as `nvidia-smi topo -m` names it.
PCIE_PATHS = {0: "INTERNAL", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}

NVML_PSTATE_UNKNOWN = 32


def reason_names(mask):
    """A clocks event (throttle) reasons bitmask as names; None stays None."""
    if mask is None:
        return None
    names = [name for bit, name in CLOCK_EVENT_REASONS if mask & bit]
    known = sum(bit for bit, dummy in CLOCK_EVENT_REASONS)
    if mask & ~known:
        names.append("other_0x%x" % (mask & ~known))
    return names


# --------------------------------------------------------------------------- the NVML seam


class NvmlUnavailable(Exception):
    """NVML cannot be used here: pynvml is not installed, or the driver's library did not start."""


class NvmlCallError(Exception):
    """One NVML call failed (not supported on this GPU, not recorded...)."""


CLOCK_LABELS = {"GRAPHICS": 0, "SM": 1, "MEM": 2}
SENSOR_LABELS = {"GPU": 0}
P2P_CAP_LABELS = {"READ": 0, "WRITE": 1, "NVLINK": 2, "ATOMICS": 3}  # nvmlGpuP2PCapsIndex_t
DEVICE = "device"
# The labels of each function's arguments after the device; other functions take a device alone
# (nvmlDevice*) or nothing (nvmlSystem*, nvmlDeviceGetCount).
ARGUMENT_LABELS = {
    "nvmlDeviceGetClockInfo": (DEVICE, CLOCK_LABELS),
    "nvmlDeviceGetMaxClockInfo": (DEVICE, CLOCK_LABELS),
    "nvmlDeviceGetTemperature": (DEVICE, SENSOR_LABELS),
    "nvmlDeviceGetTopologyCommonAncestor": (DEVICE, DEVICE),
    "nvmlDeviceGetP2PStatus": (DEVICE, DEVICE, P2P_CAP_LABELS),
}


def call_key(function, labels):
    """The recording's key of one call: nvmlDeviceGetClockInfo(0,SM)."""
    return "%s(%s)" % (function, ",".join(labels))


def plain(value):
    """NVML structs and bytes as JSON data (as the recorder stores them)."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    if hasattr(value, "_fields_"):
        return {field[0]: plain(getattr(value, field[0])) for field in value._fields_}
    return value


class LiveNvml:
    """The driver, through pynvml. The only code that imports pynvml."""

    def __init__(self):
        try:
            import pynvml
        except ImportError as error:
            raise NvmlUnavailable("pynvml (nvidia-ml-py) is not installed: %s" % error)
        self._nvml = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as error:
            raise NvmlUnavailable("NVML did not start: %s" % error)
        self._handles = {}

    def close(self):
        self._nvml.nvmlShutdown()

    def call(self, function, *labels):
        kinds = ARGUMENT_LABELS.get(function, (DEVICE,) * len(labels))
        try:
            arguments = [self._argument(kind, label) for kind, label in zip(kinds, labels)]
            return plain(getattr(self._nvml, function)(*arguments))
        except self._nvml.NVMLError as error:
            raise NvmlCallError("%s: %s" % (call_key(function, labels), error))
        except AttributeError:
            raise NvmlCallError("%s is not in this pynvml" % function)

    def _argument(self, kind, label):
        if kind == DEVICE:
            index = int(label)
            if index not in self._handles:
                self._handles[index] = self._nvml.nvmlDeviceGetHandleByIndex(index)
            return self._handles[index]
        return kind[label]


class ReplayNvml:
    """Answers from a recording (record_nvml.py's JSON: {"calls": {key: {"value"|"error": ...}}})."""

    def __init__(self, recording):
        self.recording = recording
        self.asked = []  # the keys asked, in order

    @classmethod
    def from_file(cls, path):
        with open(path, encoding="utf-8") as handle:
            return cls(json.load(handle))

    def close(self):
        pass

    def call(self, function, *labels):
        key = call_key(function, labels)
        self.asked.append(key)
        answer = self.recording["calls"].get(key)
        if answer is None:
            raise NvmlCallError("%s was not recorded" % key)
        if "error" in answer:
            raise NvmlCallError("%s: %s" % (key, answer["error"]))
        return answer["value"]


def _answer(nvml, function, *labels):
    """The call's value, or None where NVML cannot tell (not supported, not recorded)."""
    try:
        return nvml.call(function, *labels)
    except NvmlCallError:
        return None


def _watts(milliwatts):
    return None if milliwatts is None else round(milliwatts / 1000.0, 2)


def _mib(size):
    return None if size is None else int(size // (1024 * 1024))


def _cuda_version(number):
    """13000 → '13.0' (NVML's CUDA driver version is 1000 × major + 10 × minor)."""
    if not number:
        return None
    return "%d.%d" % (number // 1000, (number % 1000) // 10)


def read_nvml_facts(nvml):
    """The host's GPU facts from an NVML backend.

    {source, driver_version, cuda_version, gpus: [gpu...], links: [link...]}; a gpu:
    index, uuid, name, pci_bus_id, memory_total_mib, memory_used_mib, power_limit_w,
    power_default_w, power_min_w, power_max_w, power_enforced_w, power_draw_w,
    persistence_mode, pcie_gen_current, pcie_gen_max, pcie_width_current, pcie_width_max,
    clock_sm_mhz, clock_memory_mhz, clock_sm_max_mhz, clock_memory_max_mhz,
    performance_state, throttle_reasons (active clocks event reasons), temperature_c.
    A link (one per pair of GPUs): gpus [i, j], pcie_path (PIX/PXB/PHB/NODE/SYS), nvlink,
    p2p_read, p2p_write (ok, gpu_not_supported...). Values NVML cannot tell are None.
    """
    count = nvml.call("nvmlDeviceGetCount")
    return {
        "source": "nvml",
        "driver_version": _answer(nvml, "nvmlSystemGetDriverVersion"),
        "cuda_version": _cuda_version(
            _answer(nvml, "nvmlSystemGetCudaDriverVersion_v2") or _answer(nvml, "nvmlSystemGetCudaDriverVersion")
        ),
        "gpus": [_nvml_gpu(nvml, str(index)) for index in range(count)],
        "links": [_nvml_link(nvml, i, j) for i in range(count) for j in range(i + 1, count)],
    }


def _nvml_gpu(nvml, device):
    def ask(function, *more):
        return _answer(nvml, function, device, *more)

    memory = ask("nvmlDeviceGetMemoryInfo") or {}
    constraints = ask("nvmlDeviceGetPowerManagementLimitConstraints") or [None, None]
    reasons = ask("nvmlDeviceGetCurrentClocksEventReasons")
    if reasons is None:  # drivers before the rename
        reasons = ask("nvmlDeviceGetCurrentClocksThrottleReasons")
    pstate = ask("nvmlDeviceGetPerformanceState")
    persistence = ask("nvmlDeviceGetPersistenceMode")
    return {
        "index": int(device),
        "uuid": ask("nvmlDeviceGetUUID"),
        "name": ask("nvmlDeviceGetName"),
        "pci_bus_id": (ask("nvmlDeviceGetPciInfo") or {}).get("busId"),
        "memory_total_mib": _mib(memory.get("total")),
        "memory_used_mib": _mib(memory.get("used")),
        "power_limit_w": _watts(ask("nvmlDeviceGetPowerManagementLimit")),
        "power_default_w": _watts(ask("nvmlDeviceGetPowerManagementDefaultLimit")),
        "power_min_w": _watts(constraints[0]),
        "power_max_w": _watts(constraints[1]),
        "power_enforced_w": _watts(ask("nvmlDeviceGetEnforcedPowerLimit")),
        "power_draw_w": _watts(ask("nvmlDeviceGetPowerUsage")),
        "persistence_mode": None if persistence is None else persistence == 1,
        "pcie_gen_current": ask("nvmlDeviceGetCurrPcieLinkGeneration"),
        "pcie_gen_max": ask("nvmlDeviceGetMaxPcieLinkGeneration"),
        "pcie_width_current": ask("nvmlDeviceGetCurrPcieLinkWidth"),
        "pcie_width_max": ask("nvmlDeviceGetMaxPcieLinkWidth"),
        "clock_sm_mhz": ask("nvmlDeviceGetClockInfo", "SM"),
        "clock_memory_mhz": ask("nvmlDeviceGetClockInfo", "MEM"),
        "clock_sm_max_mhz": ask("nvmlDeviceGetMaxClockInfo", "SM"),
        "clock_memory_max_mhz": ask("nvmlDeviceGetMaxClockInfo", "MEM"),
        "performance_state": None if pstate in (None, NVML_PSTATE_UNKNOWN) else "P%d" % pstate,
        "throttle_reasons": reason_names(reasons),
        "temperature_c": ask("nvmlDeviceGetTemperature", "GPU"),
    }


def _nvml_link(nvml, i, j):
    def status(capability):
        """The P2P status between i and j, both ways: 'ok' only when both directions are."""
        both = [_answer(nvml, "nvmlDeviceGetP2PStatus", a, b, capability) for a, b in ((str(i), str(j)), (str(j), str(i)))]
        if None in both:
            return None
        worst = next((code for code in both if code != 0), 0)
        return P2P_STATUSES.get(worst, "unknown")

    nvlink = status("NVLINK")
    return {
        "gpus": [i, j],
        "pcie_path": PCIE_PATHS.get(_answer(nvml, "nvmlDeviceGetTopologyCommonAncestor", str(i), str(j))),
        "nvlink": None if nvlink is None else nvlink == "ok",
        "p2p_read": status("READ"),
        "p2p_write": status("WRITE"),
    }


# --------------------------------------------------------------------------- nvidia-smi (no NVML)


class SmiError(Exception):
    """nvidia-smi failed or printed something we cannot read."""


def _text(value):
    return value


def _number(value):
    """'450.00 W' → 450.0"""
    return float(value.split()[0])


def _integer(value):
    return int(_number(value))


def _enabled(value):
    return value == "Enabled"


def _reasons(value):
    return reason_names(int(value, 16))


# --query-gpu fields, in the order we ask for them: (field, fact, conversion). Every field exists in
# drivers since the 470 series; the throttle reasons under their old name, which newer drivers keep.
QUERY_FIELDS = (
    ("index", "index", _integer),
    ("uuid", "uuid", _text),
    ("name", "name", _text),
    ("pci.bus_id", "pci_bus_id", _text),
    ("memory.total", "memory_total_mib", _integer),
    ("memory.used", "memory_used_mib", _integer),
    ("power.limit", "power_limit_w", _number),
    ("power.default_limit", "power_default_w", _number),
    ("power.min_limit", "power_min_w", _number),
    ("power.max_limit", "power_max_w", _number),
    ("enforced.power.limit", "power_enforced_w", _number),
    ("power.draw", "power_draw_w", _number),
    ("persistence_mode", "persistence_mode", _enabled),
    ("pcie.link.gen.current", "pcie_gen_current", _integer),
    ("pcie.link.gen.max", "pcie_gen_max", _integer),
    ("pcie.link.width.current", "pcie_width_current", _integer),
    ("pcie.link.width.max", "pcie_width_max", _integer),
    ("clocks.current.sm", "clock_sm_mhz", _integer),
    ("clocks.current.memory", "clock_memory_mhz", _integer),
    ("clocks.max.sm", "clock_sm_max_mhz", _integer),
    ("clocks.max.memory", "clock_memory_max_mhz", _integer),
    ("pstate", "performance_state", _text),
    ("clocks_throttle_reasons.active", "throttle_reasons", _reasons),
    ("temperature.gpu", "temperature_c", _integer),
)
DRIVER_FIELD = "driver_version"
# Other names nvidia-smi prints in the CSV header for the fields above.
HEADER_ALIASES = {
    "clocks_event_reasons.active": "clocks_throttle_reasons.active",
    "clocks.sm": "clocks.current.sm",
    "clocks.mem": "clocks.current.memory",
    "clocks.max.mem": "clocks.max.memory",
    "gpu_uuid": "uuid",
    "gpu_name": "name",
    "gpu_bus_id": "pci.bus_id",
    "pcie.link.gen.gpucurrent": "pcie.link.gen.current",
}
NOT_AVAILABLE = ("", "N/A", "[N/A]", "[Not Supported]", "[Unknown Error]", "[Insufficient Permissions]")


def query_arguments():
    """nvidia-smi's arguments for the facts: --query-gpu=<fields> --format=csv."""
    fields = [field for field, dummy, dummy in QUERY_FIELDS] + [DRIVER_FIELD]
    return ["--query-gpu=" + ",".join(fields), "--format=csv"]


def parse_query_csv(text):
    """`nvidia-smi --query-gpu=... --format=csv` output → (gpus, driver version).

    Columns are matched by the header's names (units in brackets dropped), so any
    subset or order of QUERY_FIELDS reads; facts of columns not there are None.
    """
    rows = [row for row in csv.reader(text.strip().splitlines(), skipinitialspace=True) if row]
    if not rows:
        raise SmiError("nvidia-smi printed no CSV header")
    header = [_field_name(column) for column in rows[0]]
    gpus, driver = [], None
    for row in rows[1:]:
        if len(row) != len(header):
            raise SmiError("nvidia-smi CSV row has %d columns, the header %d: %r" % (len(row), len(header), row))
        cells = dict(zip(header, (cell.strip() for cell in row)))
        gpu = {}
        for field, fact, convert in QUERY_FIELDS:
            value = cells.get(field, "")
            gpu[fact] = None if value in NOT_AVAILABLE else convert(value)
        gpus.append(gpu)
        driver = driver or cells.get(DRIVER_FIELD) or None
    return gpus, driver


def _field_name(column):
    """'power.limit [W]' → 'power.limit' (and aliases to the names we ask for)."""
    name = re.sub(r"\s*\[[^\]]*\]$", "", column.strip())
    return HEADER_ALIASES.get(name, name)


ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")
GPU_LABEL = re.compile(r"^GPU(\d+)$")


def parse_topology_matrix(text):
    """A GPU-by-GPU matrix of `nvidia-smi topo -m` or `topo -p2p r|w` → {(i, j): cell}.

    The header names the columns (GPU0 GPU1 ..., then CPU Affinity or NICs, ignored);
    each row starts with its GPU; the diagonal (X) is left out.
    """
    columns, matrix = None, {}
    for line in ANSI_ESCAPE.sub("", text).splitlines():
        tokens = line.split()
        if not tokens or not GPU_LABEL.match(tokens[0]):
            continue
        if columns is None:  # the header: its first cell is empty, so it starts with GPU0 too
            columns = []
            for token in tokens:
                match = GPU_LABEL.match(token)
                if not match:
                    break
                columns.append(int(match.group(1)))
            continue
        row = int(GPU_LABEL.match(tokens[0]).group(1))
        for column, cell in zip(columns, tokens[1:]):
            if column != row:
                matrix[(row, column)] = cell
    return matrix


def _link_from_smi(i, j, paths, reads, writes):
    path = paths.get((i, j))
    nvlink = None if path is None else path.startswith("NV")
    return {
        "gpus": [i, j],
        "pcie_path": None if path is None or nvlink else path,
        "nvlink": nvlink,
        "p2p_read": _p2p_code(reads, i, j),
        "p2p_write": _p2p_code(writes, i, j),
    }


def _p2p_code(matrix, i, j):
    codes = [matrix.get((i, j)), matrix.get((j, i))]
    if None in codes:
        return None
    statuses = [SMI_P2P_CODES.get(code, "unknown") for code in codes]
    return next((status for status in statuses if status != "ok"), "ok")


def read_smi_facts(run):
    """The host's GPU facts from nvidia-smi; `run(arguments)` runs it and returns its stdout or raises SmiError.

    The same shape as read_nvml_facts; nvidia-smi's queries do not tell the CUDA version (None).
    """
    gpus, driver = parse_query_csv(run(query_arguments()))
    links = []
    if len(gpus) > 1:
        paths, reads, writes = (_matrix_or_empty(run, arguments) for arguments in (
            ["topo", "-m"], ["topo", "-p2p", "r"], ["topo", "-p2p", "w"]))
        indexes = [gpu["index"] for gpu in gpus]
        links = [_link_from_smi(i, j, paths, reads, writes) for i in indexes for j in indexes if i < j]
    return {"source": "nvidia-smi", "driver_version": driver, "cuda_version": None, "gpus": gpus, "links": links}


def _matrix_or_empty(run, arguments):
    """A topology matrix, or {} where this driver or machine cannot tell (the links' facts stay None)."""
    try:
        return parse_topology_matrix(run(arguments))
    except SmiError:
        return {}
