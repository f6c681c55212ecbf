"""Run results and run sets on disk.

A run set is one `provision bench` invocation (or one value of a sweep): a folder holding
  runset.json        what was measured: instance, host, model, load profile, server options, floor
  runs/c<C>-r<R>.json  vLLM's own result JSON of each run, with our context under "provision"
  runs/q<RATE>-b<B>-r<R>.json  the same, of a run at a request rate (arrivals: a tune's --rate)
  summary.json       per concurrency (and per rate, as q<RATE>-b<B>), the median of each metric over the repeats
Run sets are named (`--baseline NAME`, or <instance>-<UTC time>) and found by name under the results
folder, or by path.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from provisioner.base.secrets import redact_data
from provisioner.bench.loads import Arrivals

# the metrics a summary keeps: vLLM's result keys (latencies in ms, throughputs per second)
THROUGHPUTS = ("output_throughput", "total_token_throughput", "request_throughput", "request_goodput")
LATENCIES = tuple(f"{stat}_{metric}_ms" for metric in ("ttft", "tpot", "itl", "e2el")
                  for stat in ("mean", "median", "p50", "p90", "p99"))
COUNTS = ("completed", "failed", "duration")


class ResultError(ValueError):
    """A result file or run set cannot be read; the message says which and why."""


@dataclass
class Run:
    """One `vllm bench serve` run: its concurrency (with arrivals: the most in flight), repeat and seed, its
    arrivals (None: every request at once, held to `concurrency` in flight), and vLLM's result JSON."""

    concurrency: int
    repeat: int
    seed: int
    result: dict[str, Any]
    arrivals: Arrivals | None = None

    @property
    def file_name(self) -> str:
        if self.arrivals:
            return f"{self.arrivals.key}-r{self.repeat}.json"
        return f"c{self.concurrency}-r{self.repeat}.json"

    def to_json(self) -> dict[str, Any]:
        context: dict[str, Any] = {"concurrency": self.concurrency, "repeat": self.repeat, "seed": self.seed}
        if self.arrivals:
            context["arrivals"] = {"rate": self.arrivals.rate, "burstiness": self.arrivals.burstiness,
                                   "max_concurrency": self.arrivals.max_concurrency, "seconds": self.arrivals.seconds}
        return {**self.result, "provision": context}

    @classmethod
    def from_json(cls, data: dict[str, Any], source: str = "result") -> "Run":
        context = data.get("provision") or {}
        concurrency = context.get("concurrency", data.get("max_concurrency"))
        if not isinstance(concurrency, int):
            raise ResultError(f"{source}: no concurrency (neither provision.concurrency nor max_concurrency)")
        missing = [key for key in ("completed", "output_throughput", "median_tpot_ms") if key not in data]
        if missing:
            raise ResultError(f"{source}: not a `vllm bench serve` result — missing {', '.join(missing)}")
        result = {key: value for key, value in data.items() if key != "provision"}
        arrivals = context.get("arrivals")
        try:
            arrivals = Arrivals(float(arrivals["rate"]), float(arrivals["burstiness"]), int(arrivals["max_concurrency"]),
                                float(arrivals["seconds"])) if arrivals is not None else None
        except (KeyError, TypeError, ValueError):
            raise ResultError(f"{source}: provision.arrivals is not rate, burstiness, max_concurrency, seconds") from None
        return cls(concurrency, int(context.get("repeat", 0)), int(context.get("seed", -1)), result, arrivals)


@dataclass
class RunSet:
    name: str
    meta: dict[str, Any]
    runs: list[Run] = field(default_factory=list)

    @property
    def concurrencies(self) -> list[int]:
        """The concurrencies of the runs that sent every request at once (not those at a rate)."""
        return sorted({run.concurrency for run in self.runs if run.arrivals is None})

    @property
    def arrivals(self) -> list[Arrivals]:
        """The request rates measured (a tune's --rate), by rate."""
        return sorted({run.arrivals for run in self.runs if run.arrivals}, key=lambda a: (a.rate, a.burstiness))

    def summary(self) -> dict[int, dict[str, float]]:
        """Per concurrency, the median over repeats of every metric all its runs report."""
        return {concurrency: medians([run.result for run in self.runs
                                      if run.arrivals is None and run.concurrency == concurrency])
                for concurrency in self.concurrencies}

    def rate_summary(self) -> dict[Arrivals, dict[str, float]]:
        """Per request rate measured, the median over repeats of every metric all its runs report."""
        return {arrivals: medians([run.result for run in self.runs if run.arrivals == arrivals])
                for arrivals in self.arrivals}

    def save(self, folder: Path) -> Path:
        (folder / "runs").mkdir(parents=True, exist_ok=True)
        for run in self.runs:
            _write_json(folder / "runs" / run.file_name, run.to_json())
        _write_json(folder / "runset.json", {"name": self.name, **self.meta})
        _write_json(folder / "summary.json", {**{str(c): values for c, values in self.summary().items()},
                                              **{a.key: values for a, values in self.rate_summary().items()}})
        return folder


def medians(results: list[dict[str, Any]]) -> dict[str, float]:
    """The median over runs of every metric all of them report, and how many runs."""
    keys = [key for key in (*THROUGHPUTS, *LATENCIES, *COUNTS)
            if all(isinstance(result.get(key), (int, float)) for result in results)]
    return {**{key: statistics.median(result[key] for result in results) for key in keys}, "repeats": len(results)}


def load_run_set(folder: Path) -> RunSet:
    meta_file = folder / "runset.json"
    if not meta_file.is_file():
        raise ResultError(f"{folder}: not a run set (no runset.json)")
    meta = _read_json(meta_file)
    runs = [Run.from_json(_read_json(path), str(path)) for path in sorted((folder / "runs").glob("*.json"))]
    if not runs:
        raise ResultError(f"{folder}: the run set holds no runs")
    name = meta.pop("name", folder.name)
    return RunSet(name, meta, sorted(runs, key=run_order))


def run_order(run: Run) -> tuple:
    """Runs at once by concurrency, then runs at a rate by rate; each by repeat."""
    return (run.arrivals is not None, run.arrivals.rate if run.arrivals else 0.0, run.concurrency, run.repeat)


def find_run_set(name_or_path: str, results_dir: Path) -> RunSet:
    """A run set by name (a folder of `results_dir`) or by path; `A+B` joins run sets measured apart
    (e.g. `single-x+conc-x`: concurrency 1 from one, 16 and 64 from the other) into one."""
    if "+" in name_or_path:
        parts = [find_run_set(part, results_dir) for part in name_or_path.split("+")]
        joined = RunSet(name_or_path, {**parts[0].meta, "joined": [part.name for part in parts]})
        for part in parts:
            joined.runs += part.runs
        joined.runs.sort(key=run_order)
        return joined
    for candidate in (results_dir / name_or_path, Path(name_or_path)):
        if (candidate / "runset.json").is_file():
            return load_run_set(candidate)
    known = sorted(path.parent.name for path in results_dir.glob("*/runset.json"))
    hint = f" — known in {results_dir}: {', '.join(known)}" if known else f" — {results_dir} holds none yet"
    raise ResultError(f"no run set '{name_or_path}'{hint}")


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ResultError(f"{path}: cannot read it as JSON: {error}") from None
    if not isinstance(data, dict):
        raise ResultError(f"{path}: expected a JSON object")
    return data


def _write_json(path: Path, data: Any) -> None:
    """`data` as JSON, its secrets redacted (vLLM's result may hold what it was run with)."""
    path.write_text(json.dumps(redact_data(data), indent=1, sort_keys=False) + "\n", encoding="utf-8")
