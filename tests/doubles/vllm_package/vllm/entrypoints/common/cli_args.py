"""TEST DOUBLE of vllm.entrypoints.common.cli_args (where vLLM 0.33 keeps make_arg_parser)."""
from vllm.entrypoints.openai.cli_args import make_arg_parser  # noqa: F401
