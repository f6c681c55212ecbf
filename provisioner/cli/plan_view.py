"""How `provision plan` shows a plan: per host its memory tables, sysctls, files and environments,
or the plan as JSON (secrets redacted). Imported when `plan` runs, not for `provision --help`."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from provisioner.plan import HostPlan, PlannedFile
from provisioner.secrets import redact, redact_data, redact_environment
from provisioner.vllm.memory import TABLE_COLUMNS


def plan_json(spec: Path, plans: list[HostPlan], problems: list[str]) -> dict:
    """The plan as JSON-able data, secrets redacted: keys are the plan's field names (provisioner/plan.py)."""
    return {
        "spec": str(spec),
        "hosts": [redact_data({**asdict(host_plan), "memory_problems": host_plan.memory_problems})
                  for host_plan in plans],
        "problems": [redact(problem) for problem in problems],
    }


def show_host_plan(console: Console, plan: HostPlan) -> None:
    console.rule(f"[bold]{plan.host}[/] ({plan.address})")
    for warning in plan.warnings:
        console.print(f"[yellow]warning:[/] {escape(redact(warning))}")
    for note in plan.driver.notes if plan.driver else ():
        console.print(escape(note))

    show_memory(console, plan)
    sysctls = Table("kernel parameter", "value", title="sysctls")
    for key, value in sorted(plan.sysctls.items()):
        sysctls.add_row(Text(key), Text(str(value)))
    console.print(sysctls)

    console.print(f"[bold]/etc/fstab:[/] {escape(plan.fstab_line or '(unchanged: shm_size is null)')}")
    for path in plan.removed_files:
        console.print(f"[bold]remove:[/] {escape(path)}")

    for file in [plan.sysctl_file, *plan.nouveau_files]:
        show_file(console, file)
    for unit in plan.units:
        show_file(console, unit.unit)
        show_file(console, unit.env_file)
        show_file(console, unit.config_file)
        environment = Table("variable", "value", title=f"environment of vllm-{unit.instance}")
        for key, value in redact_environment(unit.environment).items():
            environment.add_row(Text(key), Text(value))
        console.print(environment)
    show_gateway(console, plan)
    for file in plan.monitoring_files:
        show_file(console, file)


def show_gateway(console: Console, plan: HostPlan) -> None:
    """Each route of the host's gateways with its replicas, then the haproxy.cfg the role writes."""
    if not plan.gateway_file:
        return
    routes = Table("gateway", "base URL", "model", "replicas", title="gateway routes")
    for route in plan.routes:
        routes.add_row(Text(route.gateway), Text(route.url), Text(route.model), Text(", ".join(route.replicas)))
    console.print(routes)
    show_file(console, plan.gateway_file)


def show_memory(console: Console, plan: HostPlan) -> None:
    """Per GPU: each instance's share, weights, overhead, KV cache and the full-length sequences it holds."""
    for gpu in plan.memory:
        if gpu.plan is None:
            console.print(f"[yellow]memory:[/] {escape(gpu.note or '')}")
            continue
        title = (f"memory of {gpu.label}: shares {gpu.plan.shares:.2f} of {gpu.plan.usable_fraction:g} usable, "
                 f"{gpu.plan.spare / 2**30:.2f} GiB spare once all started")
        table = Table(*TABLE_COLUMNS, title=title)
        for row in gpu.plan.table_rows():
            table.add_row(*(Text(cell) for cell in row))
        console.print(table)


def show_file(console: Console, file: PlannedFile) -> None:
    console.print(f"[bold cyan]{escape(file.path)}[/] (mode {file.mode or 'unchanged'}, role {file.role})")
    # as it is written, unwrapped (console.out: no markup, no wrapping; a 200-host plan prints 1800 files)
    console.out(redact(file.content), highlight=False)
