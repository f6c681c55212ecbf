#!/usr/bin/env python3
"""Check a `vllm` command line with the installed vLLM's own parser, before a unit is (re)started.

    <venv>/bin/python vllm-check-args.py serve --config /etc/vllm/chat.yaml [more args...]
    <venv>/bin/python vllm-check-args.py bench serve --model M [more args...]

Builds the parser as the `vllm` console script does (vllm/entrypoints/cli/main.py: a
FlexibleArgumentParser, the command registered by its own module's cmd_init()/subparser_init()),
parses the arguments with it (FlexibleArgumentParser.parse_args reads `--config FILE.yaml` and turns
its keys into flags, and rewrites `-O3`, `--a_b`, `--json-arg.key v`), then runs the command's own
validate(), as `vllm` does before it dispatches. Nothing is started and no GPU is looked at.

Exit 0 and `ok: vllm <version> accepts the arguments`; exit 2 and vLLM's error line
(`vllm: error: unrecognized arguments: ...`, `vllm serve: error: argument --dtype: invalid choice: ...`).
Checks what the parser checks: ranges and the model's limits are checked later, by the engine.
As in vLLM, a `false` boolean in the YAML file is dropped (write the negative flag as true).

Standard library and vLLM only: it is copied to the host alone and run with the vLLM venv's python.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import tempfile

# The module that registers each `vllm` command, as vllm/entrypoints/cli/main.py lists them.
COMMAND_MODULES = {
    "serve": "vllm.entrypoints.cli.serve",
    "bench": "vllm.entrypoints.cli.benchmark.main",
}


def build_parser(command: str):
    """The `vllm` parser with `command` registered as the CLI registers it; and the commands."""
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    module = importlib.import_module(COMMAND_MODULES[command])
    parser = FlexibleArgumentParser(prog="vllm", description="vLLM CLI")
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    commands = {}
    for cmd in module.cmd_init():
        cmd.subparser_init(subparsers).set_defaults(dispatch_function=cmd.cmd)
        commands[cmd.name] = cmd
    return parser, commands


def deprecated_used(parser, namespace) -> list[str]:
    """Options given that vLLM marks deprecated (its own warning is silenced with its log): argparse's
    `deprecated=` or vLLM's `_deprecated` set (on the class up to 0.28, on each parser in 0.33)."""
    stack, found = [parser], []
    while stack:
        p = stack.pop()
        marked = getattr(p, "_deprecated", ())
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                stack.extend(action.choices.values())
            elif action.option_strings and (getattr(action, "deprecated", False) or action in marked):
                if getattr(namespace, action.dest, action.default) != action.default:
                    found.append(action.option_strings[0])
    return sorted(set(found))


def with_yaml_name(args: list[str], folder: str) -> list[str]:
    """vLLM reads --config only from a .yaml/.yml file name; Ansible's `validate` hands over a temporary
    file without one: link it under a .yaml name in `folder`."""
    if "--config" not in args or args.index("--config") + 1 >= len(args):
        return args
    index = args.index("--config") + 1
    if args[index].endswith((".yaml", ".yml")):
        return args
    link = os.path.join(folder, "config.yaml")
    os.symlink(os.path.abspath(args[index]), link)
    return [*args[:index], link, *args[index + 1:]]


def main(args: list[str]) -> int:
    with tempfile.TemporaryDirectory(prefix="vllm-check-args-") as folder:
        return check(with_yaml_name(args, folder))


def check(args: list[str]) -> int:
    if not args or args[0] not in COMMAND_MODULES:
        print(f"usage: vllm-check-args.py {{{','.join(COMMAND_MODULES)}}} [args...]", file=sys.stderr)
        return 2
    command = args[0]
    # vLLM reads sys.argv while it builds the parser (`vllm bench` registers its subcommands only
    # when argv names it; `--help` adds help texts and, for serve, drops --model): make it vLLM's.
    sys.argv = ["vllm", *args]
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    # Give vLLM the CPU platform before anything resolves one, so no GPU or NVML is queried: the
    # parser is the same (neither CPU nor CUDA adds arguments in pre_register_and_update).
    from vllm import platforms
    from vllm.platforms.cpu import CpuPlatform

    platforms.current_platform = CpuPlatform()
    import vllm

    parser, commands = build_parser(command)
    try:
        namespace = parser.parse_args(args)  # argparse errors: usage + "vllm ...: error: ..." and exit 2
        if namespace.subparser in commands:
            commands[namespace.subparser].validate(namespace)
    except SystemExit as exc:
        return 2 if exc.code not in (0, None) else 0  # --help exits 0
    except Exception as exc:  # noqa: BLE001 - vLLM raises ValueError/TypeError/OSError for these
        print(f"vllm {command}: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    for name in deprecated_used(parser, namespace):
        print(f"warning: {name} is deprecated in vllm {vllm.__version__}", file=sys.stderr)
    print(f"ok: vllm {vllm.__version__} accepts the arguments")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
