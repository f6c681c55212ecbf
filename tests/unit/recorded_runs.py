"""Recorded vLLM result JSONs (tests/fixtures/vllm/h200-*) laid out as `provision tune --from-results` reads
them: LABEL/runset.json, LABEL/runs/c<CONCURRENCY>-r<ROUND>.json."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable
from pathlib import Path


def lay_out_run_set(folder: Path, label: str, results: Iterable[tuple[Path, str]]) -> None:
    """The run set LABEL under `folder`: each (result JSON, its name under runs/, e.g. c64-r2)."""
    runs = folder / label / "runs"
    runs.mkdir(parents=True)
    (folder / label / "runset.json").write_text(json.dumps({"name": label}))
    for result, name in results:
        shutil.copy(result, runs / f"{name}.json")
