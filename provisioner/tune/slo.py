"""The SLO a tuning run must meet, parsed before any host is touched.

Bounds on a latency percentile of every run: `ttft_p99<=200ms,itl_p99<=30ms` (metric ttft, tpot, itl or
e2el; statistic p50, p90, p99, mean or median; a unit of ms or s). Or vLLM's goodput (`vllm bench serve
--goodput`): per-request bounds without a statistic (`ttft<=200ms,tpot<=50ms`, vLLM knows ttft, tpot and
e2el) and the share of requests that must meet them all, `goodput>=95%` (request_goodput /
request_throughput of each run). A candidate meets the SLO when it holds at every concurrency of the load.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from provisioner.base.module_utils import value_rules

METRICS = ("ttft", "tpot", "itl", "e2el")
STATISTICS = ("p50", "p90", "p99", "mean", "median")
GOODPUT_METRICS = ("ttft", "tpot", "e2el")  # what vLLM's --goodput takes
FORM = "write e.g. 'ttft_p99<=200ms,itl_p99<=30ms', or vLLM's goodput: 'goodput>=95%,ttft<=200ms,tpot<=50ms'"
_TERM = re.compile(r"^(?P<name>[a-z0-9_]+)\s*(?P<op><=|>=|<|>|=)\s*(?P<number>[0-9]+(?:\.[0-9]+)?)\s*(?P<unit>ms|s|%)?$")


class SloError(ValueError):
    """The SLO text is malformed; the message names the term and the fix."""


@dataclass(frozen=True)
class Bound:
    metric: str  # ttft | tpot | itl | e2el
    statistic: str | None  # p99 …; None: a per-request goodput bound
    limit_ms: float

    @property
    def key(self) -> str:
        """The summary key it reads (vLLM's result key): p99_ttft_ms."""
        return f"{self.statistic}_{self.metric}_ms"

    @property
    def label(self) -> str:
        name = f"{self.metric}_{self.statistic}" if self.statistic else self.metric
        return f"{name}<={self.limit_ms:g}ms"


@dataclass(frozen=True)
class Slo:
    bounds: tuple[Bound, ...]  # statistic bounds (read from each run's percentiles)
    goodput_bounds: tuple[Bound, ...] = ()  # per-request bounds of vLLM's --goodput
    min_goodput: float | None = None  # the share of requests (0..1) that must meet goodput_bounds

    @property
    def text(self) -> str:
        terms = [bound.label for bound in self.bounds]
        if self.min_goodput is not None:
            terms += [f"goodput>={self.min_goodput * 100:g}%", *(bound.label for bound in self.goodput_bounds)]
        return ",".join(terms)

    def goodput_args(self) -> list[str]:
        """`vllm bench serve --goodput` values (KEY:MS), empty without a goodput SLO."""
        return [f"{bound.metric}:{bound.limit_ms:g}" for bound in self.goodput_bounds]

    def ratios(self, values: dict[str, float]) -> dict[str, float | None]:
        """Per term, measured / limit (≤ 1 meets it; goodput: the missing share / the allowed one);
        None where the run did not report the value."""
        ratios: dict[str, float | None] = {}
        for bound in self.bounds:
            value = values.get(bound.key)
            ratios[bound.label] = None if value is None else value / bound.limit_ms
        if self.min_goodput is not None:
            good, total = values.get("request_goodput"), values.get("request_throughput")
            label = f"goodput>={self.min_goodput * 100:g}%"
            if good is None or not total:
                ratios[label] = None
            else:
                ratios[label] = (1 - good / total) / max(1 - self.min_goodput, 1e-9) if good < total else 0.0
        return ratios


def parse_slo(text: str) -> Slo:
    """'ttft_p99<=200ms,itl_p99<=30ms' → Slo; SloError naming the term and the fix."""
    bounds: list[Bound] = []
    goodput_bounds: list[Bound] = []
    min_goodput = None
    terms = [term.strip() for term in text.split(",") if term.strip()]
    if not terms:
        raise SloError(f"--slo is empty — {FORM}")
    for term in terms:
        match = _TERM.match(term.lower())
        if not match:
            raise SloError(f"--slo term {term!r} is not NAME<=LIMIT — {FORM}")
        name, op, number, unit = match["name"], match["op"], float(match["number"]), match["unit"]
        if name == "goodput":
            if op != ">=" or unit != "%" or value_rules.share_limit_problem(number):
                raise SloError(f"--slo term {term!r}: goodput takes a share of requests above 0%, at most 100%, "
                               "e.g. goodput>=95%")
            min_goodput = number / 100
            continue
        metric, _, statistic = name.partition("_")
        if metric not in METRICS:
            raise SloError(f"--slo term {term!r}: no metric '{metric}' — use one of {', '.join(METRICS)} "
                           f"(e.g. {metric}_p99 → ttft_p99)")
        if statistic and statistic not in STATISTICS:
            raise SloError(f"--slo term {term!r}: no statistic '{statistic}' — use one of {', '.join(STATISTICS)}")
        if op != "<=":
            raise SloError(f"--slo term {term!r}: a latency bound is an upper limit — write {name}<={match['number']}ms")
        if unit not in ("ms", "s"):
            raise SloError(f"--slo term {term!r}: give the unit — {name}<={match['number']}ms")
        limit = number * (1000 if unit == "s" else 1)  # a 400-digit number is float('inf'): refused here
        if value_rules.latency_limit_problem(limit):
            raise SloError(f"--slo term {term!r}: the limit must be above 0 and at most an hour "
                           f"({value_rules.MAX_LATENCY_MS}ms) — e.g. {name}<=200ms")
        if statistic:
            bounds.append(Bound(metric, statistic, limit))
        elif metric in GOODPUT_METRICS:
            goodput_bounds.append(Bound(metric, None, limit))
        else:
            raise SloError(f"--slo term {term!r}: vLLM's goodput bounds are {', '.join(GOODPUT_METRICS)}; for "
                           f"{metric}, name a statistic: {metric}_p99<={match['number']}{unit}")
    if goodput_bounds and min_goodput is None:
        raise SloError("--slo: per-request bounds without a statistic (" + ",".join(b.label for b in goodput_bounds)
                       + ") are vLLM's goodput — add the share that must meet them, e.g. goodput>=95%, or name a "
                       "statistic (ttft_p99<=…)")
    if min_goodput is not None and not goodput_bounds:
        raise SloError("--slo: goodput needs per-request bounds, e.g. goodput>=95%,ttft<=200ms,tpot<=50ms")
    return Slo(tuple(bounds), tuple(goodput_bounds), min_goodput)
