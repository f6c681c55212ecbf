"""Every file the roles write that no other row checks: present, its content as the role renders (or copies) it, its owner and mode.

Spec mode. The files (provisioner/audit/expectations.py `managed_files`), each with its path, owner and
mode from the role's own task: the nvidia_gpu role's boot script, settings file and boot unit (where the spec
lists GPU devices); vllm_service's readiness probe and flag check (every host); each instance's unit — a venv
instance's unit less the [Service] lines that rows of their own read as systemd runs them (`UNIT: SETTING`,
`UNIT: ExecStart`, `UNIT: Environment NAME`) —, its quadlet or compose file and the compose file's boot unit; where the spec has `monitoring:`, role
node_exporter's arguments file, the GPU timer's script and units, and on the monitoring host role prometheus's
configuration (prometheus.yml, its rules and targets files) and arguments file.
Left to rows of their own, so that one drift fails one row: the sysctl file (`sysctl at boot: KEY`), the
nouveau files (`nouveau file: PATH`), the env files (`UNIT: EnvironmentFile mode`, `owner`, `content`: they hold
the API key, compared by sha256, never shown) and the `vllm serve --config` files (`UNIT: config file PATH`).
"""

from __future__ import annotations

import base64
import dataclasses
import shlex
from typing import Any

from provisioner.audit.engine import Output
from provisioner.audit.instance_files import first_difference
from provisioner.audit.registry import ABSENT, each
from provisioner.base.file_formats import systemd_words
from provisioner.base.module_utils import gpu_settings
from provisioner.validation.roles import render_role_file


def commands(expected):
    # mode and owner, then the content in base64 (one line: no framing to escape)
    return {f"managed{index}": f"stat -c '%a %U:%G' {shlex.quote(managed['path'])} && base64 -w0 {shlex.quote(managed['path'])}"
            for index, managed in enumerate(expected.get("managed_files", []))}


def read(expected, out):
    """Each managed file by path: ((mode, owner:group), its content); None: absent."""
    return {"managed_files": {managed["path"]: file_read(out[f"managed{index}"])
                              for index, managed in enumerate(expected.get("managed_files", []))}}


def file_read(out: Output) -> tuple[tuple[str, str], str] | None:
    """((mode, owner:group), content) of the managed-file command's output; None: absent (or unreadable)."""
    lines = out.text.splitlines()
    if out.rc != 0 or not lines:
        return None
    mode, owner = lines[0].split()
    content = base64.b64decode(lines[1] if len(lines) > 1 else "").decode("utf-8", "replace")
    return (mode.zfill(4), owner), content

managed = each(lambda expected: expected.get("managed_files", []), ids=lambda file: file["path"])


@managed
def managed_file(case, facts, audit):
    """`file PATH` — a file a role writes, against the role's own: present, its content (the first differing line), its owner and mode.

    Modes: spec.

    Expected `as rendered (N lines, OWNER:GROUP MODE)`; actual the same where it is, else `(absent)`, or the
    first differing line (`line 7: 'x' instead of 'y'`) and the file's owner and mode. The GPU settings file
    holds the power limits the role resolved on the cards ('max' → watts): it is rendered from the GPUs read
    in the same round trip, with the role's own template and the module's own code (n/a where they could
    not be read: the `GPU count` row says why).
    """
    file = case.item
    check = f"file {file['path']}"
    content = file["content"]
    if content is None:
        content = rendered_gpu_settings(audit, check, file, facts)
    lines = f"{len(content.splitlines())} lines"
    expected = f"as rendered ({lines}, {file['owner']} {file['mode']})"
    if file.get("unit"):
        left_to_the_unit(audit, check, expected, file, facts)
    found = facts.managed_files.get(file["path"])
    if found is None:
        audit.expect(check, expected, ABSENT, passed=False)
    (mode, owner), text = found
    difference = content_difference(content, text, file.get("skip"))
    stat = f"{owner} {mode}"
    actual = f"as rendered ({lines}, {stat})" if difference is None else f"{difference} ({stat})"
    audit.expect(check, expected, actual, passed=difference is None and (owner, mode) == (file["owner"], file["mode"]))


def left_to_the_unit(audit, check: str, expected: str, file: dict[str, Any], facts) -> None:
    """A unit file whose unit systemd did not load (a venv instance's: masked, not found, a bad setting) or
    that is masked (the boot unit) is the unit's own row's: `UNIT: unit file`, `nvidia-gpu-limits.service: enabled`."""
    name = file["unit"]
    if name in facts.units:
        state = facts.units[name].shown.get("LoadState") or "unknown to systemd"
        if state != "loaded":
            audit.not_applicable(check, expected, f"systemd did not load {name} ({state}): see {name}: unit file")
    elif (facts.gpu_boot_unit or {}).get("LoadState") == "masked":
        audit.not_applicable(check, expected, f"{name} is masked: see {name}: enabled")


def rendered_gpu_settings(audit, check: str, file: dict[str, Any], facts) -> str:
    """The settings file as the role renders it on this host: its template with the targets the module
    resolves on the GPUs read (plan_settings, the module's own code)."""
    render = file["render"]
    if facts.gpu is None:
        audit.not_applicable(check, f"as rendered ({file['owner']} {file['mode']})",
                             f"the GPUs could not be read ({facts.gpu_problem}): see GPU count")
    planned = gpu_settings.plan_settings({"gpus": [dataclasses.asdict(gpu) for gpu in facts.gpu.gpus]},
                                         render["devices"], render["variables"]["nvidia_gpu_persistence_mode"])
    variables = {**render["variables"], "_nvidia_gpu_result": {"targets": planned["targets"]}}
    return render_role_file(file["role"], render["template"], variables).content


def content_difference(expected: str, actual: str, skip: dict[str, Any] | None) -> str | None:
    """None where the file is as expected, else its first difference (line numbers: the file's own)."""
    if skip is None:
        return None if actual == expected else first_difference(expected, actual)
    wanted, found = kept_lines(expected, skip), kept_lines(actual, skip)
    if [line for _, line in wanted] == [line for _, line in found]:
        return None
    for (_, line), (number, other) in zip(wanted, found):
        if line != other:
            return f"line {number}: {other!r} instead of {line!r}"
    if len(found) > len(wanted):
        number, extra = found[len(wanted)]
        return f"line {number}: {extra!r} added"
    return f"ends at line {len(actual.splitlines())}; missing {wanted[len(found)][1]!r}"


def kept_lines(text: str, skip: dict[str, Any]) -> list[tuple[int, str]]:
    """(number, line) of the lines this row compares: all but, in skip's section, the settings of skip's
    keys and the Environment= lines that set only skip's variables."""
    kept, section = [], ""
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if stripped.startswith("[") and stripped.endswith("]"):
            section = stripped[1:-1]
        elif section == skip["section"] and "=" in stripped and not stripped.startswith(("#", ";")):
            key, _, value = stripped.partition("=")
            key = key.strip()
            if key in skip["keys"]:
                continue
            if key == "Environment":
                names = [word.partition("=")[0] for word in systemd_words(value.strip().replace("%%", "%")) or []]
                if names and all(name in skip["environment"] for name in names):
                    continue
        kept.append((number, line))
    return kept
