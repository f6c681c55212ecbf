"""`provision bench`: load-test a deployed instance with the installed vLLM's own `vllm bench serve`.

loads      named load profiles (lengths, concurrencies, prompts)
command    the `vllm bench serve` command line of one run
results    run results, run sets on disk, medians over repeats
compare    two run sets side by side, with deltas
plots      PNG charts of run sets against concurrency, with the batch-1 TPOT floor
floor      the TPOT floor: weight bytes / HBM bandwidth measured on the host
target     an instance of the spec as the bench reaches it (host shell, vllm, URL, model, key)
session    repeats with fresh seeds, progress, one JSON per run kept
sweep      one variable changed at a time, the instance restarted, the original put back
"""
