"""TEST DOUBLE of vllm.entrypoints.cli.serve: the `serve` subcommand, registered as vLLM registers it
(cmd_init() → subcommands with subparser_init / validate / cmd); its cmd runs the stand-in server."""
from vllm.entrypoints.openai.cli_args import make_arg_parser


class ServeSubcommand:
    name = "serve"

    @staticmethod
    def cmd(args):
        from vllm.entrypoints.cli.standin_server import serve
        serve(vars(args))

    def validate(self, args):
        if not (args.model_tag or getattr(args, "model", None)):
            raise ValueError("No model specified! Please specify model either as a positional argument or in a config file.")

    def subparser_init(self, subparsers):
        parser = subparsers.add_parser("serve", usage="vllm serve [model_tag] [options]")
        return make_arg_parser(parser)


def cmd_init():
    return [ServeSubcommand()]
