"""The phases of a vLLM 0.25.0 start, read from the server logs that restart_study.py / c64_grid.py write
(each line stamped with seconds since the process started):

  python3 benchmarks/h200/restart_phases.py LOG...   -> a Markdown table, one row per log

Columns (seconds since the process started): `api` the API server's first log line (interpreter start,
imports, CLI parsing); `engine` the EngineCore's first line (its process started and, under spawn, vLLM
imported again); `loaded` weights loaded; `compiled` torch.compile done (cache loads); `graphs` CUDA
graphs captured; `warmed` the kernel warm-up done (JIT monitor activated); `engine_ready` "init engine
... took"; `api_up` the API's "Application startup complete.". Standard library only."""

from __future__ import annotations

import sys
from pathlib import Path

MARKS = [("api", "(APIServer", "non-default args"), ("engine", "(EngineCore", ""),
         ("loaded", "(EngineCore", "Model loading took"), ("compiled", "(EngineCore", "torch.compile took"),
         ("graphs", "(EngineCore", "Graph capturing finished"), ("warmed", "(EngineCore", "Kernel JIT monitor activated"),
         ("engine_ready", "(EngineCore", "init engine"), ("api_up", "(APIServer", "Application startup complete")]


def phases(log: Path) -> dict:
    found: dict = {}
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("#"):
            continue
        stamp, _, text = line.strip().partition(" ")
        for name, who, what in MARKS:
            if name not in found and who in text and what in text:
                found[name] = float(stamp)
    return found


def main(paths: list[str]) -> None:
    names = [name for name, _, _ in MARKS]
    print("| log | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for path in paths:
        found = phases(Path(path))
        print(f"| {Path(path).name} | " + " | ".join(f"{found[n]:.1f}" if n in found else "–" for n in names) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
