#!/usr/bin/python3
"""TEST DOUBLE — a stand-in for `nvidia-smi`, installed on the test hosts by the tests only.

The test hosts have no GPU. This stand-in answers from a fixture (tests/fixtures/gpu/<machine>/:
query-gpu.csv, and topo-m.txt / topo-p2p-r.txt / topo-p2p-w.txt for several GPUs) and keeps a
state so that what the tests set sticks:

  --query-gpu=F1,F2,... --format=csv[,noheader][,nounits] [-i GPU]   the fixture's columns, from the state
  --query-compute-apps=pid,used_memory,gpu_uuid,... --format=csv[,noheader][,nounits]
                            the processes holding GPU memory (below), in the recorded format
                            (tests/fixtures/gpu/h200-processes/record.json)
  [-i GPU] -pm 0|1          persistence mode          [-i GPU] -pl WATTS   power limit (within min..max)
  topo -m | topo -p2p r|w   the fixture's matrices    -L                   the GPUs
  (GPU: an index, a UUID or a PCI bus id)

The state lives under /run (a tmpfs): every boot starts again from the fixture, as a real card
comes up at its default (here: the fixture's) settings — so tests see whether a boot unit
re-applies the limits. Every call is appended to a log (argv, exit status, boot id) that the
tests read to assert what the module and the boot unit ran. With a file FAIL_AT_BOOT holding N,
the first N calls of each boot fail as nvidia-smi does before the driver is loaded.

Compute processes: the stand-in vLLM server (tests/doubles/vllm_package) starts a child named
`VLLM::EngineCore`, as real vLLM does, whose command line declares what it would hold:
`standin-gpu=CUDA_VISIBLE_DEVICES standin-count=N standin-share=S`. Each such process of the host
(read from /proc) holds S × the card's memory.total (at most what is still free) on the first N of
those GPUs (all GPUs when CUDA_VISIBLE_DEVICES is empty), and memory.used adds it up: nothing to set,
the processes that run are the state.

Standard library only (the test hosts have no network). The functions at the end (install,
recorded_calls, standin_state) run on the test machine, not on the hosts.
"""
import csv
import json
import os
import sys
import time

FIXTURE_DIR = os.environ.get("NVIDIA_SMI_STANDIN_FIXTURE", "/usr/local/share/nvidia-smi-standin")
STATE_FILE = os.environ.get("NVIDIA_SMI_STANDIN_STATE", "/run/nvidia-smi-standin/state.json")
CALL_LOG = os.environ.get("NVIDIA_SMI_STANDIN_LOG", "/var/log/nvidia-smi-standin/calls.jsonl")
FAIL_AT_BOOT = os.path.join(FIXTURE_DIR, "FAIL_AT_BOOT")
# query names nvidia-smi accepts for the columns the fixture names otherwise
QUERY_ALIASES = {
    "clocks_throttle_reasons.active": "clocks_event_reasons.active",
    "clocks.sm": "clocks.current.sm",
    "clocks.mem": "clocks.current.memory",
    "clocks.max.mem": "clocks.max.memory",
    "gpu_uuid": "uuid",
    "gpu_name": "name",
    "gpu_bus_id": "pci.bus_id",
}
NO_DRIVER = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
             "Make sure that the latest NVIDIA driver is installed and running.")


class Failure(Exception):
    def __init__(self, message, status=2):
        super().__init__(message)
        self.status = status


def boot_id():
    try:
        with open("/proc/sys/kernel/random/boot_id") as handle:
            return handle.read().strip()
    except OSError:
        return "unknown"


# --------------------------------------------------------------------------- state


def fixture_state():
    """The state a boot starts from: the fixture's CSV as {columns: [(name, unit)], gpus: [{name: value}]}."""
    with open(os.path.join(FIXTURE_DIR, "query-gpu.csv")) as handle:
        rows = [row for row in csv.reader(handle, skipinitialspace=True) if row]
    columns = [split_header(cell) for cell in rows[0]]
    gpus = [{name: value.strip() for (name, _), value in zip(columns, row)} for row in rows[1:]]
    return {"boot_id": boot_id(), "calls": 0, "columns": columns, "gpus": gpus}


def split_header(cell):
    """'power.limit [W]' → ('power.limit', 'W')"""
    cell = cell.strip()
    if cell.endswith("]") and " [" in cell:
        name, unit = cell[:-1].split(" [", 1)
        return name, unit
    return cell, None


def load_state():
    try:
        with open(STATE_FILE) as handle:
            state = json.load(handle)
        if state.get("boot_id") == boot_id():
            return state
    except (OSError, ValueError):
        pass
    return fixture_state()


def save_state(state):
    os.makedirs(os.path.dirname(STATE_FILE), exist_ok=True)
    temporary = STATE_FILE + ".tmp"
    with open(temporary, "w") as handle:
        json.dump(state, handle)
    os.replace(temporary, STATE_FILE)


def log_call(argv, status):
    os.makedirs(os.path.dirname(CALL_LOG), exist_ok=True)
    with open(CALL_LOG, "a") as handle:
        handle.write(json.dumps({"time": time.time(), "boot_id": boot_id(), "argv": argv, "status": status}) + "\n")


# --------------------------------------------------------------------------- commands


def select(state, selector):
    """The GPUs -i chooses (all without -i)."""
    if selector is None:
        return state["gpus"]
    for gpu in state["gpus"]:
        if selector in (gpu.get("index"), gpu.get("uuid"), gpu.get("pci.bus_id")):
            return [gpu]
    raise Failure("No devices were found matching the -i value %r" % selector, 6)


ENGINE_CORE = "VLLM::EngineCore"
PROC = "/proc"
# --query-compute-apps fields: name → (header, unit)
COMPUTE_FIELDS = {
    "pid": ("pid", None), "process_name": ("process_name", None), "name": ("process_name", None),
    "used_memory": ("used_gpu_memory", "MiB"), "used_gpu_memory": ("used_gpu_memory", "MiB"),
    "gpu_uuid": ("gpu_uuid", None), "gpu_bus_id": ("gpu_bus_id", None), "gpu_name": ("gpu_name", None),
    "gpu_serial": ("gpu_serial", None),
}


def mib(cell):
    try:
        return int(float(cell.split()[0]))
    except (ValueError, IndexError, AttributeError):
        return 0


def engine_cores():
    """The stand-in vLLM's engine cores running on this host: [(pid, visible, count, share)], by pid."""
    found = []
    for name in os.listdir(PROC):
        if not name.isdigit():
            continue
        try:
            with open(os.path.join(PROC, name, "cmdline"), "rb") as handle:
                words = handle.read().decode("utf-8", "replace").split("\0")
        except OSError:
            continue
        if words[0] != ENGINE_CORE:
            continue
        declared = dict(word.split("=", 1) for word in words if word.startswith("standin-") and "=" in word)
        try:
            found.append((int(name), declared.get("standin-gpu", ""), int(declared.get("standin-count", "1")),
                          float(declared.get("standin-share", "0.9"))))
        except ValueError:
            continue
    return sorted(found)


def compute_apps(state):
    """[(pid, gpu, MiB)] of the engine cores, in pid order (the order memory was taken)."""
    free = {gpu["uuid"]: mib(gpu.get("memory.total")) - mib(gpu.get("memory.used")) for gpu in state["gpus"]}
    apps = []
    for pid, visible, count, share in engine_cores():
        chosen = []
        for entry in [word.strip() for word in visible.split(",") if word.strip()] or [g["index"] for g in state["gpus"]]:
            chosen += [gpu for gpu in state["gpus"] if entry in (gpu["index"], gpu["uuid"]) and gpu not in chosen]
        for gpu in chosen[:count]:
            taken = max(0, min(int(share * mib(gpu.get("memory.total"))), free[gpu["uuid"]]))
            free[gpu["uuid"]] -= taken
            apps.append((pid, gpu, taken))
    return apps


def with_apps(state):
    """The GPUs with memory.used counting what the compute processes hold."""
    held = {}
    for _, gpu, taken in compute_apps(state):
        held[gpu["uuid"]] = held.get(gpu["uuid"], 0) + taken
    gpus = []
    for gpu in state["gpus"]:
        gpu = dict(gpu)
        if "memory.used" in gpu and held.get(gpu["uuid"]):
            gpu["memory.used"] = "%d MiB" % (mib(gpu["memory.used"]) + held[gpu["uuid"]])
        gpus.append(gpu)
    return {**state, "gpus": gpus}


def query_compute_apps(state, fields, formats):
    for field in fields:
        if field not in COMPUTE_FIELDS:
            raise Failure('Field "%s" is not a valid field to query.' % field)
    lines = []
    if "noheader" not in formats:
        lines.append(", ".join(header if unit is None or "nounits" in formats else "%s [%s]" % (header, unit)
                               for header, unit in (COMPUTE_FIELDS[field] for field in fields)))
    for pid, gpu, taken in compute_apps(state):
        values = {"pid": str(pid), "process_name": ENGINE_CORE, "used_gpu_memory": str(taken),
                  "gpu_uuid": gpu["uuid"], "gpu_bus_id": gpu.get("pci.bus_id", ""), "gpu_name": gpu.get("name", ""),
                  "gpu_serial": gpu.get("serial", "[N/A]")}
        cells = []
        for field in fields:
            header, unit = COMPUTE_FIELDS[field]
            cells.append(values[header] + ("" if unit is None or "nounits" in formats else " " + unit))
        lines.append(", ".join(cells))
    return "\n".join(lines)


def query(state, fields, formats, selector):
    state = with_apps(state)
    units = dict(state["columns"])
    names = [QUERY_ALIASES.get(field, field) for field in fields]
    for field, name in zip(fields, names):
        if name not in units:
            raise Failure('Field "%s" is not a valid field to query.' % field)
    lines = []
    if "noheader" not in formats:
        lines.append(", ".join(name if units[name] is None or "nounits" in formats else "%s [%s]" % (name, units[name])
                               for name in names))
    for gpu in select(state, selector):
        cells = [gpu[name] for name in names]
        if "nounits" in formats:
            cells = [cell.split(" ")[0] if units[name] else cell for name, cell in zip(names, cells)]
        lines.append(", ".join(cells))
    return "\n".join(lines)


def set_persistence(state, value, selector):
    if value not in ("0", "1"):
        raise Failure('Invalid value "%s" for -pm' % value)
    lines = []
    for gpu in select(state, selector):
        gpu["persistence_mode"] = "Enabled" if value == "1" else "Disabled"
        lines.append("%s Legacy persistence mode for GPU %s." % (gpu["persistence_mode"], gpu["pci.bus_id"]))
    return "\n".join(lines + ["All done."])


def set_power_limit(state, value, selector):
    watts = float(value)
    lines = []
    for gpu in select(state, selector):
        low, high = (float(gpu[field].split()[0]) for field in ("power.min_limit", "power.max_limit"))
        if not low <= watts <= high:
            raise Failure("Provided power limit %.2f W is not a valid power limit which should be between %.2f W and "
                          "%.2f W for GPU %s\nTerminating early due to previous errors." % (watts, low, high, gpu["pci.bus_id"]))
        before = gpu["power.limit"]
        gpu["power.limit"] = gpu["enforced.power.limit"] = "%.2f W" % watts
        lines.append("Power limit for GPU %s was set to %.2f W from %s." % (gpu["pci.bus_id"], watts, before))
    return "\n".join(lines + ["All done."])


def fixture_text(name):
    path = os.path.join(FIXTURE_DIR, name)
    if not os.path.exists(path):
        raise Failure("topology is not available for this stand-in's fixture", 1)
    with open(path) as handle:
        return handle.read().rstrip("\n")


def run(argv, state):
    """Output for one call; raises Failure. Changes `state` for -pm / -pl."""
    options, selector, i = [], None, 0
    while i < len(argv):
        if argv[i] in ("-i", "--id"):
            selector = argv[i + 1]
            i += 2
        else:
            options.append(argv[i])
            i += 1
    if options[:1] == ["topo"]:
        if options[1:] == ["-m"]:
            return fixture_text("topo-m.txt")
        if options[1:2] == ["-p2p"] and options[2:] in (["r"], ["w"]):
            return fixture_text("topo-p2p-%s.txt" % options[2])
    if options == ["-L"]:
        return "\n".join("GPU %s: %s (UUID: %s)" % (gpu["index"], gpu["name"], gpu["uuid"]) for gpu in state["gpus"])
    if len(options) == 2 and options[0] == "-pm":
        return set_persistence(state, options[1], selector)
    if len(options) == 2 and options[0] == "-pl":
        return set_power_limit(state, options[1], selector)
    queries = [o for o in options if o.startswith("--query-gpu=")]
    formats = [o.split("=", 1)[1].split(",") for o in options if o.startswith("--format=")]
    apps = [o for o in options if o.startswith("--query-compute-apps=")]
    if apps and formats and "csv" in formats[0] and len(options) == 2:
        return query_compute_apps(state, apps[0].split("=", 1)[1].split(","), formats[0])
    if queries and formats and "csv" in formats[0] and len(options) == 2:
        return query(state, queries[0].split("=", 1)[1].split(","), formats[0], selector)
    raise Failure("stand-in nvidia-smi: unsupported arguments %s" % argv)


def main(argv):
    state = load_state()
    state["calls"] += 1
    status, output = 0, ""
    try:
        failing = int(open(FAIL_AT_BOOT).read()) if os.path.exists(FAIL_AT_BOOT) else 0
        if state["calls"] <= failing:
            raise Failure(NO_DRIVER, 9)
        output = run(argv, state)
    except Failure as failure:
        status, output = failure.status, str(failure)
    save_state(state)
    log_call(argv, status)
    (sys.stdout if status == 0 else sys.stderr).write(output + "\n")
    return status


# --------------------------------------------------------------------------- the test machine's side

STANDIN_PATH = "/usr/bin/nvidia-smi"
FIXTURE_FILES = ("query-gpu.csv", "topo-m.txt", "topo-p2p-r.txt", "topo-p2p-w.txt")


def install(host, fixture, uuids=None, fail_at_boot=0):
    """Install the stand-in as the host's nvidia-smi, fed by `fixture` (a tests/fixtures/gpu/<machine> folder).

    `uuids` replace the fixture's GPU UUIDs in order (a spec's made-up UUIDs); `fail_at_boot` makes
    the first calls of every boot fail as before the driver is loaded.
    """
    import tempfile
    from pathlib import Path

    fixture = Path(fixture)
    with tempfile.TemporaryDirectory() as scratch:
        for name in FIXTURE_FILES:
            source = fixture / name
            if not source.exists():
                continue
            text = source.read_text()
            if name == "query-gpu.csv" and uuids:
                text = _with_uuids(text, uuids)
            copy = Path(scratch) / name
            copy.write_text(text)
            host.put(copy, f"{FIXTURE_DIR}/{name}", mode="0644")
        if fail_at_boot:
            flag = Path(scratch) / "FAIL_AT_BOOT"
            flag.write_text(str(fail_at_boot))
            host.put(flag, FAIL_AT_BOOT, mode="0644")
    host.put(Path(__file__), STANDIN_PATH, mode="0755")


def _with_uuids(csv_text, uuids):
    lines = csv_text.splitlines()
    header = [split_header(cell)[0] for cell in lines[0].split(",")]
    column = header.index("uuid")
    rows = []
    for line, uuid in zip(lines[1:], uuids):
        cells = line.split(", ")
        cells[column] = uuid
        rows.append(", ".join(cells))
    return "\n".join([lines[0], *rows]) + "\n"


def recorded_calls(host):
    """Every call the host's stand-in received: [{time, boot_id, argv, status}], oldest first."""
    text = host.ssh(f"cat {CALL_LOG} 2>/dev/null || true").stdout
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def setter_calls(calls):
    """The calls that changed something (-pm, -pl)."""
    return [call for call in calls if "-pm" in call["argv"] or "-pl" in call["argv"]]


def standin_gpus(host):
    """The stand-in's GPUs as it answers now: [{uuid, power.limit, persistence_mode}]."""
    text = host.ssh(f"{STANDIN_PATH} --query-gpu=uuid,power.limit,persistence_mode --format=csv,noheader,nounits").stdout
    return [dict(zip(("uuid", "power.limit", "persistence_mode"), line.split(", "))) for line in text.splitlines()]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
