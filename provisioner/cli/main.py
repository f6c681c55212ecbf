"""`provision`: the command line. Each command group lives in its own module."""

from __future__ import annotations

import typer

from provisioner.cli import apply_cmd, audit_cmd, bench_cmd, facts_cmd, spec_cmds, trust_cmd, wheelhouse_cmd

app = typer.Typer(
    name="provision",
    help="Turn a bare NVIDIA GPU server into a tuned, audited vLLM inference host.",
    no_args_is_help=True,
    add_completion=False,
)

app.command("init")(spec_cmds.init)
app.command("inventory")(spec_cmds.inventory)
app.command("plan")(spec_cmds.plan)
app.command("apply")(apply_cmd.apply)
app.command("facts")(facts_cmd.facts)
app.command("audit")(audit_cmd.audit)
app.command("wheelhouse")(wheelhouse_cmd.wheelhouse)
app.command("bench")(bench_cmd.bench)
app.command("trust")(trust_cmd.trust)


if __name__ == "__main__":
    app()
