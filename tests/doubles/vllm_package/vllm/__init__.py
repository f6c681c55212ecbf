"""TEST DOUBLE — a stand-in for the `vllm` package, built into a wheel by tests/doubles/vllm_wheel.py
and installed on the test hosts by the role vllm_install from a wheelhouse, as real vLLM would be.

There is no GPU on the test hosts. What it keeps of vLLM: the console script `vllm` at the same entry
point (vllm.entrypoints.cli.main:main); a `vllm serve` parser with every option of the real version,
built from that version's committed flag catalog (provisioner/vllm/catalogs), at the module paths the
real parser lives at, so an unknown flag or a bad value fails as vLLM fails; `--config FILE.yaml`
expanded as vLLM does (YAML read as one `key: JSON value` per line, what our template writes: the
hosts have no PyYAML); and an HTTP server answering /health, /v1/models, a 1-token /v1/completions,
/version,
plus /standin/process (the argv, parsed options and CUDA environment it got). Standard library only.
"""

__version__ = "0.0.0"  # replaced by the wheel builder
