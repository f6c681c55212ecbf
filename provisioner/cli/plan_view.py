"""How `provision plan` shows a plan: per host its memory tables, sysctls, files and environments,
or the plan as JSON (secrets redacted). Imported when `plan` runs, not for `provision --help`."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.text import Text

from provisioner.base.secrets import redact, redact_data, redact_environment
from provisioner.cli.console import print_rule, print_table
from provisioner.plan import HostPlan, PlannedFile
from provisioner.validation.gate import Refusal
from provisioner.vllm.memory import TABLE_COLUMNS


def plan_json(spec: Path, plans: list[HostPlan], refusals: list[Refusal]) -> dict:
    """The plan as JSON-able data, secrets redacted: keys are the plan's field names (provisioner/plan.py); the
    preflight's problems as the gate's JSON error shows them (field, message, fix)."""
    return {
        "spec": str(spec),
        "hosts": [redact_data({**asdict(host_plan), "memory_problems": host_plan.memory_problems})
                  for host_plan in plans],
        "problems": [redact_data(refusal.as_json()) for refusal in refusals],
    }


def say(console: Console, markup: str) -> None:
    """One line of console markup; off a terminal written as its plain text (a 200-host plan has thousands)."""
    if console.is_terminal:
        console.print(markup)
    else:
        console.file.write(Text.from_markup(markup).plain + "\n")


def show_host_plan(console: Console, plan: HostPlan) -> None:
    print_rule(console, f"{plan.host} ({plan.address})")
    for warning in plan.warnings:
        say(console, f"[yellow]warning:[/] {escape(redact(warning))}")
    for change in plan.semantic_changes:
        say(console, f"[cyan]semantic:[/] {escape(redact(change))}")
    for note in plan.driver.notes if plan.driver else ():
        say(console, escape(note))

    show_memory(console, plan)
    print_table(console, ("kernel parameter", "value"),
                [(key, str(value)) for key, value in sorted(plan.sysctls.items())], title="sysctls")

    say(console, f"[bold]/etc/fstab:[/] {escape(plan.fstab_line or '(unchanged: shm_size is null)')}")
    for path in plan.removed_files:
        say(console, f"[bold]remove:[/] {escape(path)}")

    for file in [plan.sysctl_file, *plan.nouveau_files]:
        show_file(console, file)
    for unit in plan.units:
        show_file(console, unit.unit)
        show_file(console, unit.env_file)
        show_file(console, unit.config_file)
        print_table(console, ("variable", "value"), list(redact_environment(unit.environment).items()),
                    title=f"environment of vllm-{unit.instance}")
    show_gateway(console, plan)
    for file in plan.monitoring_files:
        show_file(console, file)


def show_gateway(console: Console, plan: HostPlan) -> None:
    """Each route of the host's gateways with its replicas, then the haproxy.cfg the role writes."""
    if not plan.gateway_file:
        return
    print_table(console, ("gateway", "base URL", "model", "replicas"),
                [(route.gateway, route.url, route.model, ", ".join(route.replicas)) for route in plan.routes],
                title="gateway routes")
    for route in plan.routes:
        if route.carries:
            say(console, f"[bold]route {escape(route.model)}:[/] {escape(route.carries)}")
    show_file(console, plan.gateway_file)


def show_memory(console: Console, plan: HostPlan) -> None:
    """Per GPU: each instance's share, weights, overhead, KV cache and the full-length sequences it holds."""
    for gpu in plan.memory:
        if gpu.plan is None:
            say(console, f"[yellow]memory:[/] {escape(gpu.note or '')}")
            continue
        title = (f"memory of {gpu.label}: shares {gpu.plan.shares:.2f} of {gpu.plan.usable_fraction:g} usable, "
                 f"{gpu.plan.spare / 2**30:.2f} GiB spare once all started")
        print_table(console, TABLE_COLUMNS, gpu.plan.table_rows(), title=title)


def show_file(console: Console, file: PlannedFile) -> None:
    say(console, f"[bold cyan]{escape(file.path)}[/] (mode {file.mode or 'unchanged'}, role {file.role})")
    # as it is written, unwrapped (a 200-host plan prints 1800 files): off a terminal, as it is
    if console.is_terminal:
        console.out(redact(file.content), highlight=False)
    else:
        console.file.write(redact(file.content) + "\n")
