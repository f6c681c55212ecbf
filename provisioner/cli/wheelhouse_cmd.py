"""`provision wheelhouse`: download a pinned vLLM and its dependencies once, for offline installs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from provisioner.cli.common import PROBLEMS_FOUND, exit_with

app = typer.Typer()


@app.command()
def wheelhouse(
    vllm_version: Annotated[str, typer.Option("--vllm-version", help="The vLLM version the hosts run (the spec's vllm.version).")],
    out: Annotated[Path, typer.Option("--out", help="The folder to fill; the spec's vllm.wheelhouse points at it.")],
    python_version: Annotated[str, typer.Option(
        "--python-version", help="The hosts' Python (Debian 12: 3.11, Ubuntu 24.04: 3.12).")] = "3.11",
    extra: Annotated[list[str] | None, typer.Option("--extra", help="More requirement specifiers (repeatable).")] = None,
) -> None:
    """Download vllm==VERSION and every dependency as wheels for the hosts' Python into OUT."""
    from provisioner.vllm.wheelhouse import build_wheelhouse

    typer.echo(f"downloading vllm=={vllm_version} for Python {python_version} into {out} ...")
    try:
        built = build_wheelhouse(vllm_version, out, python_version, tuple(extra or ()))
    except RuntimeError as error:
        exit_with(PROBLEMS_FOUND, f"wheelhouse: {error}")
    typer.echo(f"{len(built.wheels)} wheels, {built.size_bytes / 2**30:.2f} GiB in {out}")
