# SPDX-License-Identifier: Apache-2.0
"""What to change on a host's GPUs: persistence mode and power limits, planned from its facts.

Shared, like nvidia_gpu_facts, by the Ansible module `nvidia_gpu` and the provisioner
package (the audit's power check resolves targets with the same code); standard library
only. It reads the facts' plain data (see nvidia_gpu_facts.read_nvml_facts) and never
touches a GPU: `plan_settings` says what would change, `nvidia_smi_arguments` how.

A device, as the inventory lists it (nvidia_gpu_devices): {index, uuid, model, power_limit};
power_limit is watts (a positive integer), "max" (the card's maximum) or "default".
"""

from __future__ import annotations

# A power limit within this many watts of its target counts as the target (NVML works in
# milliwatts; cards round what they are given).
POWER_TOLERANCE_W = 1.0
POWER_WORDS = ("max", "default")


def watts_text(watts):
    """450.0 → '450', 312.5 → '312.5' (as nvidia-smi -pl takes it)."""
    return "%g" % watts


def gpu_label(gpu):
    """'GPU 0 (NVIDIA GeForce RTX 4090, GPU-...)'"""
    return "GPU %s (%s, %s)" % (gpu["index"], gpu.get("name") or "unknown model", gpu.get("uuid") or "no UUID")


def is_power_target(value):
    """watts (a positive integer), 'max' or 'default'."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return value > 0
    return value in POWER_WORDS


def resolve_power_target(target, gpu):
    """The watts a target means on this GPU and the problem with it; (None, None): nothing to set ('default' on a
    card without power management)."""
    if not is_power_target(target):
        return None, "%s: %r is not a power limit — use watts (a positive integer, e.g. 450), 'max' or 'default'" % (
            gpu_label(gpu), target)
    low, high = gpu.get("power_min_w"), gpu.get("power_max_w")
    if target == "default":
        return gpu.get("power_default_w"), None  # None: the card manages its own power, nothing to set
    if low is None or high is None:
        return None, "%s does not report its power limit range (power management not supported), so power_limit %s " \
            "cannot be set — use 'default'" % (gpu_label(gpu), target)
    watts = high if target == "max" else float(target)
    if not low <= watts <= high:
        return None, "%s: power limit %s W is outside the card's range %s–%s W — use a value from %s to %s, 'max' or 'default'" % (
            gpu_label(gpu), watts_text(watts), watts_text(low), watts_text(high), watts_text(low), watts_text(high))
    return watts, None


def power_limit_matches(current, target):
    return current is not None and abs(current - target) <= POWER_TOLERANCE_W


def plan_settings(facts, devices, persistence_mode):
    """What to change so the GPUs match the devices and persistence mode.

    Returns {changes, targets, problems}:
    - changes: [{index, uuid, name, setting, before, after}] in the order to apply them —
      persistence mode first (on every GPU of the host; None leaves it), then power limits
      (setting 'power_limit_w');
    - targets: [{index, uuid, power_limit, power_limit_w}] each device's resolved target;
    - problems: messages naming the GPU; when there are any, nothing may be changed.
    """
    by_index = {gpu["index"]: gpu for gpu in facts["gpus"]}
    changes, targets, problems = [], [], []
    for device in devices:
        gpu = by_index.get(device["index"])
        problem = _device_problem(device, gpu, by_index)
        if problem:
            problems.append(problem)
            continue
        target = device.get("power_limit", "default")
        watts, problem = resolve_power_target(target, gpu)
        if problem:
            problems.append(problem)
            continue
        if watts is None:
            continue
        targets.append({"index": gpu["index"], "uuid": gpu["uuid"], "power_limit": target, "power_limit_w": watts})
        if not power_limit_matches(gpu.get("power_limit_w"), watts):
            changes.append(_change(gpu, "power_limit_w", gpu.get("power_limit_w"), watts))
    if persistence_mode is not None:
        persistence = [
            _change(gpu, "persistence_mode", gpu["persistence_mode"], persistence_mode)
            for gpu in facts["gpus"]
            if gpu.get("persistence_mode") is not None and gpu["persistence_mode"] != persistence_mode
        ]
        changes = persistence + changes
    return {"changes": changes, "targets": targets, "problems": problems}


def _device_problem(device, gpu, by_index):
    if gpu is None:
        present = ", ".join(str(index) for index in sorted(by_index)) or "none"
        return "GPU %s is listed but this host has no GPU %s (GPUs present: %s) — correct the index (nvidia-smi -L)" % (
            device["index"], device["index"], present)
    expected_uuid = device.get("uuid")
    if expected_uuid and gpu.get("uuid") and expected_uuid.lower() != gpu["uuid"].lower():
        return "%s is not the listed %s — update the uuid of GPU %s (nvidia-smi -L lists them)" % (
            gpu_label(gpu), expected_uuid, device["index"])
    return None


def _change(gpu, setting, before, after):
    return {"index": gpu["index"], "uuid": gpu.get("uuid"), "name": gpu.get("name"),
            "setting": setting, "before": before, "after": after}


def nvidia_smi_arguments(change):
    """The nvidia-smi arguments that make one change (the GPU chosen by UUID, never by position)."""
    selector = change["uuid"] if change.get("uuid") else str(change["index"])
    if change["setting"] == "persistence_mode":
        return ["-i", selector, "-pm", "1" if change["after"] else "0"]
    return ["-i", selector, "-pl", watts_text(change["after"])]


def describe_change(change):
    """'GPU 0: power limit 300 W → 450 W'"""
    if change["setting"] == "persistence_mode":
        return "GPU %s: persistence mode %s → %s" % (change["index"], _on_off(change["before"]), _on_off(change["after"]))
    return "GPU %s: power limit %s → %s W" % (change["index"], _watts_or_unknown(change["before"]), watts_text(change["after"]))


def settings_text(facts, changes, after):
    """The GPUs' settings as text for Ansible's diff: as they are, or (after=True) with the changes made."""
    changed = {(change["index"], change["setting"]): change["after"] for change in changes} if after else {}
    lines = []
    for gpu in facts["gpus"]:
        persistence = changed.get((gpu["index"], "persistence_mode"), gpu.get("persistence_mode"))
        limit = changed.get((gpu["index"], "power_limit_w"), gpu.get("power_limit_w"))
        lines.append("GPU %s %s (%s)" % (gpu["index"], gpu.get("uuid"), gpu.get("name")))
        lines.append("  persistence_mode: %s" % _on_off(persistence))
        lines.append("  power_limit: %s W" % _watts_or_unknown(limit))
    return "\n".join(lines) + "\n"


def _on_off(value):
    return "unknown" if value is None else ("on" if value else "off")


def _watts_or_unknown(value):
    return "unknown" if value is None else watts_text(value)
