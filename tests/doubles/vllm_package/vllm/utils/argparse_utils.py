"""TEST DOUBLE of vllm.utils.argparse_utils: FlexibleArgumentParser (underscores or dashes in long
names; --config FILE.yaml pulled into the arguments as vLLM does: after the subcommand and the model,
before the rest, so the command line wins over the file)."""
import argparse
import json


def load_config_file(path):
    """`key: value` lines (value JSON, or a bare word) → ['--key', 'value', ...] as vLLM flattens YAML:
    true → the bare flag, false → nothing (vLLM's behaviour), a list → its items, a mapping → its JSON."""
    if path.split(".")[-1] not in ("yaml", "yml"):
        raise ValueError(f"Config file must be of a yaml/yml type. {path.split('.')[-1]} supplied")
    arguments = []
    with open(path) as handle:
        for line in handle:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, _, text = line.partition(":")
            text = text.strip()
            try:
                value = json.loads(text)
            except ValueError:
                value = text
            if isinstance(value, bool):
                arguments += ["--" + key] if value else []
            elif isinstance(value, list):
                arguments += ["--" + key, *map(str, value)] if value else []
            elif isinstance(value, dict):
                arguments += ["--" + key, json.dumps(value)]
            else:
                arguments += ["--" + key, str(value)]
    return arguments


class FlexibleArgumentParser(argparse.ArgumentParser):
    def parse_args(self, args=None, namespace=None):
        import sys
        args = list(sys.argv[1:] if args is None else args)
        if "--config" in args:
            args = self._pull_args_from_config(args)
        normalized = []
        for arg in args:
            if arg.startswith("--"):
                name, equals, value = arg.partition("=")
                normalized.append(name.replace("_", "-") + equals + value)
            else:
                normalized.append(arg)
        return super().parse_args(normalized, namespace)

    @staticmethod
    def _pull_args_from_config(args):
        index = args.index("--config")
        if index == len(args) - 1:
            raise ValueError("No config file specified! Please check your command-line arguments.")
        config_args = load_config_file(args[index + 1])
        if args and args[0] == "serve":
            model_in_cli = len(args) > 1 and not args[1].startswith("-")
            if model_in_cli:
                return args[:2] + config_args + args[2:index] + args[index + 2:]
            if "--model" not in config_args:
                raise ValueError("No model specified! Please specify model either as a positional argument or in a config file.")
            return args[:1] + config_args + args[1:index] + args[index + 2:]
        return config_args + args[:index] + args[index + 2:]
