"""A `vllm serve` command line read as vLLM reads it: its options (the command line wins over its
--config file), where it listens, the URL that reaches it and the model names it answers with.
"""

from __future__ import annotations

from typing import Any

from provisioner.base.module_utils import value_rules

bracketed = value_rules.bracketed  # an address as it goes before :port (the one rule, value_rules)
VLLM_DEFAULT_PORT = 8000
VLLM_MEMORY_SHARE = 0.9  # vLLM's default --gpu-memory-utilization
ANY_ADDRESS = ("", "0.0.0.0", "::", "[::]")


def serving_expectations(argv: list[str], config: dict[str, Any] | None = None) -> dict[str, Any]:
    """Where a `vllm serve` command line listens and which model names it answers with; `config`: the
    content of its --config file (the command line wins over it, as in vLLM)."""
    options = {**config_options(config or {}), **command_options(argv)}
    bind = options.get("--host", [""])[0]
    port = int(options.get("--port", [VLLM_DEFAULT_PORT])[0])
    model = serve_model(argv, options)
    scheme = "https" if options.get("--ssl-certfile") else "http"
    probe_host = "127.0.0.1" if bind in ANY_ADDRESS else bind
    return {
        "listen": f"{bracketed(bind or '0.0.0.0')}:{port}",
        "url": f"{scheme}://{bracketed(probe_host)}:{port}",
        "served_names": options.get("--served-model-name") or [model],
    }


def command_options(argv: list[str]) -> dict[str, list[str]]:
    """--flag value... / --flag=value / --flag → {flag: [values]} (a bare flag: [])."""
    options: dict[str, list[str]] = {}
    current = None
    for word in argv:
        if word.startswith("--"):
            name, equals, value = word.partition("=")
            current = name
            options[current] = [value] if equals else []
        elif current is not None:
            options[current].append(word)
    return options


def config_options(config: dict[str, Any]) -> dict[str, list[str]]:
    """A --config file's keys as command_options gives them: {"--served-model-name": ["a", "b"], ...}."""
    options = {}
    for key, value in config.items():
        values = value if isinstance(value, list) else [] if value is True else [value]
        options["--" + str(key).replace("_", "-")] = [str(item) for item in values]
    return options


def serve_model(argv: list[str], options: dict[str, list[str]]) -> str:
    """The model of `vllm serve MODEL …` (or of `--model MODEL`)."""
    if "serve" in argv and argv.index("serve") + 1 < len(argv):
        candidate = argv[argv.index("serve") + 1]
        if not candidate.startswith("--"):
            return candidate
    return (options.get("--model") or ["(unknown)"])[0]



def memory_share(options: dict[str, list[str]]) -> tuple[float, str]:
    """(--gpu-memory-utilization, where it comes from): the command line, else its --config file, else vLLM's default."""
    values = options.get("--gpu-memory-utilization") or []
    try:
        return float(values[0]), "--gpu-memory-utilization"
    except (IndexError, ValueError):
        return VLLM_MEMORY_SHARE, "vLLM's default"
