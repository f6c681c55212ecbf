"""TEST DOUBLE of vllm.entrypoints.openai.cli_args: make_arg_parser adds every `vllm serve` option of
the real version, read from its committed catalog (vllm/catalog.json in this wheel)."""
import argparse
import json
import os
import re

# in the wheel: beside the package; run from the source tree: the catalog VLLM_STANDIN_CATALOG names
CATALOG = os.environ.get("VLLM_STANDIN_CATALOG") or os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "catalog.json")


def human_int(text):
    """Like vLLM's human-readable ints: 4096, 32k, 1M, 'auto' (-1)."""
    if text.lower() == "auto":
        return -1
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgG]?)", text)
    if not match:
        raise argparse.ArgumentTypeError(f"invalid human-readable integer: {text!r}")
    number, unit = match.groups()
    scale = {"": 1, "k": 1000, "K": 1024, "m": 10**6, "M": 2**20, "g": 10**9, "G": 2**30}[unit]
    return int(float(number) * scale)


def json_value(text):
    try:
        return json.loads(text)
    except ValueError:
        return text  # dotted keys and the like: vLLM's own parser takes more forms


def boolean(text):
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"invalid boolean: {text!r}")


TYPES = {"int": int, "float": float, "str": str, "human_int": human_int, "json": json_value, "bool": boolean,
         "other": str}


def add_option(parser, option):
    names, kind = option["names"], option["kind"]
    settings = {"dest": option["dest"], "default": argparse.SUPPRESS}
    if kind == "flag":
        parser.add_argument(*names, action="store_true", **settings)
        return
    if kind == "bool_optional":
        names = names + ([option["negative"]] if option.get("negative") else [])
        parser.add_argument(*names, action="store_true" if not option.get("negative") else _BooleanPair, **settings)
        return
    if option.get("nargs") is not None:
        settings["nargs"] = option["nargs"]
    if option.get("choices"):
        settings["choices"] = option["choices"]
        settings["type"] = str
    else:
        settings["type"] = TYPES.get(kind, str)
    parser.add_argument(*names, **settings)


class _BooleanPair(argparse.Action):
    """--flag sets True, its negative (the last name) sets False; no value."""

    def __init__(self, option_strings, dest, **kwargs):
        kwargs.pop("nargs", None)
        self.negative = option_strings[-1]
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, option_string != self.negative)


def make_arg_parser(parser):
    with open(CATALOG) as handle:
        serve = json.load(handle)["commands"]["serve"]
    parser.add_argument("model_tag", nargs="?", default=None)
    for option in serve["options"].values():
        if option["names"] == ["--help"] or "-h" in option["names"]:
            continue
        add_option(parser, option)
    return parser
