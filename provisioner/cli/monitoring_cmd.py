"""`provision monitoring export`: the Prometheus configuration of the spec's monitoring (scrape targets, alert
rules), for your own Prometheus; the same files role prometheus writes on the spec's monitoring host."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from provisioner.cli.common import PROBLEMS_FOUND, SpecOption, exit_on_write_error, exit_with, gate_or_exit

app = typer.Typer(help="Export the Prometheus configuration of the spec's monitoring (scrape targets, alert rules, "
                       "Grafana dashboards) for your own Prometheus.", no_args_is_help=True)


@app.command("export")
def export(
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder to write prometheus.yml, rules/, targets/ and dashboards/ to.")],
    spec: SpecOption = None,
) -> None:
    """Validate the spec and write its Prometheus configuration: prometheus.yml, the alert rules
    (rules/vllm-provision.yml) and the file_sd targets (targets/<job>.yml); and the Grafana dashboards
    (dashboards/*.json, for Grafana's file provisioning); every file or none."""
    from provisioner.fleet.monitoring import export as write_export

    loaded = gate_or_exit(spec).spec
    if loaded.monitoring is None:
        exit_with(PROBLEMS_FOUND, "the spec has no monitoring: section — add one (`monitoring: {}` puts the exporters "
                                  "on every host at the next apply), then export its configuration")
    with exit_on_write_error(out):
        written = write_export(loaded, out)
    for path in written:
        typer.echo(f"wrote {path}")
    typer.echo(f"check it with `promtool check config {out / 'prometheus.yml'}`; point your Prometheus at it, or "
               "merge its scrape_configs and rule_files into yours (paths are relative to its folder)")
