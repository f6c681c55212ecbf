"""TEST DOUBLE of vllm.entrypoints.cli.main: `vllm --version`, and `vllm serve` parsed by the real
version's options (see vllm/__init__.py), then a stand-in server instead of an engine."""
import sys

import vllm
from vllm.entrypoints.cli import serve as serve_command
from vllm.utils.argparse_utils import FlexibleArgumentParser


def main(argv=None):
    """As vLLM's main: a FlexibleArgumentParser with the subcommands registered, parse, validate, dispatch."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["--version"], ["-v"]):
        print(vllm.__version__)
        return 0
    parser = FlexibleArgumentParser(prog="vllm", description="vLLM CLI (TEST DOUBLE)")
    subparsers = parser.add_subparsers(required=True, dest="subparser")
    commands = {}
    for command in serve_command.cmd_init():
        command.subparser_init(subparsers).set_defaults(dispatch_function=command.cmd)
        commands[command.name] = command
    try:
        args = parser.parse_args(argv)
        commands[args.subparser].validate(args)
    except ValueError as error:
        sys.exit(f"vllm: error: {error}")
    args.dispatch_function(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
