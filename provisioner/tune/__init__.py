"""`provision tune`: Seed 2's method automated — baseline, one flag at a time, load-tested with vLLM's own
`vllm bench serve`, keep what measurably helps while an SLO holds; the winner is the highest throughput
that meets the SLO.

slo       the SLO: p99 (or other) TTFT/TPOT/ITL/E2EL bounds, or vLLM's goodput
space     the flags searched, their candidate values, checked against the pinned vLLM's catalog;
          which of them change GPU memory (so which candidates may share one GPU)
search    candidates, outcomes (a run set against the SLO), coordinate descent under a budget,
          the Pareto front and the winner
measure   measuring a candidate: live (the same validation and restore as `bench --sweep`, `vllm bench
          serve` through the bench session) or from recorded run sets (offline)
write     the winner into the spec as the instance's options, with a comment naming the measurement
plot      the Pareto plot (throughput against the SLO)
"""
