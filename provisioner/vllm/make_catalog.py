"""Write the catalog of `vllm serve` and `vllm bench serve` options of the installed vLLM.

Run it with the Python of a venv that has vLLM installed (VENV below), from the repository root:

    VENV/bin/python -m provisioner.vllm.make_catalog --out provisioner/vllm/catalogs

It builds the parsers the way the `vllm` console script does (vllm/entrypoints/cli/main.py): a
`FlexibleArgumentParser` with one subparser per command, registered by the command's own
`cmd_init()` / `subparser_init()` (serve: `vllm.entrypoints.cli.serve`, which calls
`make_arg_parser` from `vllm.entrypoints.openai.cli_args` up to 0.28 and from
`vllm.entrypoints.common.cli_args` in 0.33; bench: `vllm.entrypoints.cli.benchmark.main`).
It then walks the argparse actions and writes `vllm-<version>.json`. For each option that takes a
typed value it also parses `vllm serve some/model --OPTION FORM` for every form of VALUE_FORMS (and
the option alone) and records, under `value_forms`, what the parser made of each form it accepted and
which it refused: provisioner/vllm/flags.py takes exactly those (tests/unit/test_spec_holes.py).

The kind of each option is decided by its action class and by calling its `type` with sample
strings, so it says what the parser really accepts. Standard library and vLLM only: the venv that
runs this has none of the provisioner's dependencies.

vLLM needs a platform to build its parser (the default `DeviceConfig` asks for it); on a machine
without a GPU it finds none, so the CPU platform is set first, as `vllm bench` itself does. Neither
the CPU nor the CUDA platform adds to the parser (`pre_register_and_update` is a no-op for both);
building it asks the platform only for the default DeviceConfig's device, which no option shows.
vLLM's environment variables (VLLM_*) can change defaults: run it in a clean environment.

It also records the wheel's build under `builds` (`wheel_build`): the CUDA it was built for, read from
the installed wheels' own metadata (vLLM's torch pin, torch's CUDA toolkit pin, `torch.version.cuda`),
which is what decides the driver the hosts need (provisioner/vllm/cuda_drivers.py). Builds recorded by
hand beside it (another CUDA variant, `"generated": false`) are kept when the catalog is written again.
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import sys
from pathlib import Path
from typing import Any

# Sample strings given to each option's type callable; what it accepts decides the kind.
PROBES = ("7", "0.5", "abc", "32k", '{"a": 1}', "{}", "true")
KINDS = ("flag", "bool_optional", "int", "float", "str", "json", "human_int", "bool", "other")
HELP_MAX = 200


def _prepare_argv() -> None:
    """Make vLLM build what `vllm bench --help` would: every bench subparser (registered only when
    argv's first positional is `bench`) and the help texts (read from the config classes' docs only
    when an argv item contains `--help`, checked once when vllm.engine.arg_utils is imported).
    `serve` stays out of argv: `vllm serve --help` leaves out `--model`."""
    sys.argv = ["vllm", "bench", "--help"]


def _set_cpu_platform() -> str:
    """Give vLLM the CPU platform before anything resolves one (resolving looks for GPUs through
    NVML and finds none here), as `vllm bench` does where it finds none."""
    from vllm import platforms
    from vllm.platforms.cpu import CpuPlatform

    platforms.current_platform = CpuPlatform()
    return type(platforms.current_platform).__name__


def build_cli_parser() -> tuple[argparse.ArgumentParser, dict[str, str]]:
    """The `vllm` parser with the `serve` and `bench` commands, registered as the CLI does.
    Returns it and, per command, the module path that built it."""
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    serve_mod = importlib.import_module("vllm.entrypoints.cli.serve")
    bench_mod = importlib.import_module("vllm.entrypoints.cli.benchmark.main")

    parser = FlexibleArgumentParser(prog="vllm", description="vLLM CLI")
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    for mod in (serve_mod, bench_mod):
        for cmd in mod.cmd_init():
            cmd.subparser_init(subparsers).set_defaults(dispatch_function=cmd.cmd)

    make_arg_parser = getattr(serve_mod, "make_arg_parser", None)
    serve_src = serve_mod.__name__
    if make_arg_parser is not None:
        serve_src += f" -> {make_arg_parser.__module__}.make_arg_parser"
    bench_src = bench_mod.__name__
    bench_serve = importlib.import_module("vllm.entrypoints.cli.benchmark.serve")
    add_cli_args = getattr(bench_serve, "add_cli_args", None)
    if add_cli_args is not None:
        bench_src += f" -> {add_cli_args.__module__}.add_cli_args"
    return parser, {"serve": serve_src, "bench serve": bench_src}


def subparser(parser: argparse.ArgumentParser, *path: str) -> argparse.ArgumentParser:
    """The parser of a (nested) subcommand, e.g. subparser(p, "bench", "serve")."""
    for name in path:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[name]
    return parser


# ---------------------------------------------------------------------------------------------
# classifying one action


def _type_callable(parser: argparse.ArgumentParser, action: argparse.Action) -> Any:
    t = action.type
    if isinstance(t, str):  # argparse lets a registered name stand for the callable
        t = parser._registry_get("type", t, t)
    return t


def type_name(t: Any) -> str:
    if t is None:
        return "None"  # argparse keeps the string as given
    name = getattr(t, "__qualname__", None) or getattr(t, "__name__", None)
    if name:
        return re.sub(r"\.<locals>", "", name)
    return re.sub(r" at 0x[0-9a-fA-F]+", "", repr(t))


def probe(t: Any) -> dict[str, Any]:
    """What the type callable makes of each sample string; samples it refuses are left out."""
    results = {}
    for sample in PROBES:
        try:
            results[sample] = t(sample)
        except Exception:  # noqa: BLE001 - any refusal counts as "not accepted"
            continue
    return results


def _is_structured(value: Any) -> bool:
    """A mapping, a dataclass or a pydantic model: what a JSON object parses into."""
    import dataclasses
    from collections.abc import Mapping

    return isinstance(value, Mapping) or dataclasses.is_dataclass(value) or hasattr(value, "model_dump")


def kind_of(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    if isinstance(action, argparse.BooleanOptionalAction):
        return "bool_optional"
    if action.nargs == 0:  # store_true/false/const, help, version, count
        return "flag"
    t = _type_callable(parser, action)
    if t is None:
        return "str"
    got = probe(t)
    if any(s in got and _is_structured(got[s]) for s in ('{"a": 1}', "{}")):
        return "json"
    ints = [s for s in ("7", "32k") if isinstance(got.get(s), int) and not isinstance(got.get(s), bool)]
    if ints == ["7", "32k"]:
        return "human_int"
    if ints == ["7"] and "0.5" not in got and "abc" not in got:
        return "int"
    if isinstance(got.get("0.5"), float) and "abc" not in got:
        return "float"
    if got.get("true") is True and "abc" not in got:
        return "bool"
    if got.get("abc") == "abc":
        return "str"
    return "other"


def first_sentence(text: str | None) -> str | None:
    """The help's first sentence (or its lead-in, where a list follows), whitespace collapsed."""
    if not text or text == argparse.SUPPRESS:
        return None
    text = text.replace("%%", "%")
    text = re.split(r"\n\s*\n|\n\s*(?:[-*+]|\d+\.)\s", text, maxsplit=1)[0]  # first paragraph, before a list
    text = re.sub(r"\s+", " ", text).strip()
    m = re.search(r"(?<!e\.g)(?<!i\.e)(?<!etc)\.(?=\s|$)", text)
    if m:
        text = text[: m.end()]
    if len(text) > HELP_MAX:
        text = text[: HELP_MAX - 1].rstrip() + "…"
    return text or None


def _plain(value: Any) -> Any:
    """Enums as their values, tuples and sets as lists, dataclasses as dicts; JSON's types as they are."""
    import dataclasses
    import enum

    if isinstance(value, enum.Enum):
        return _plain(value.value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((_plain(v) for v in value), key=repr)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return value


def jsonable(value: Any) -> Any:
    """The default as JSON, or its repr (memory addresses removed) where JSON can't hold it."""
    try:
        plain = _plain(value)
        json.dumps(plain, allow_nan=False)
        return plain
    except (TypeError, ValueError, RecursionError):
        return re.sub(r" at 0x[0-9a-fA-F]+", "", repr(value))


def _deprecation_marked(parser: argparse.ArgumentParser, action: argparse.Action) -> bool:
    """Deprecated by argparse (`deprecated=`, Python >= 3.13), by vLLM's stand-in for older Pythons
    (a `_deprecated` set: on the class up to 0.28, on the parser in 0.33), or by vLLM's help text
    (0.33 writes "--x is deprecated ..." into the option's help instead)."""
    if getattr(action, "deprecated", False):
        return True
    if action in getattr(parser, "_deprecated", ()):
        return True
    text = re.sub(r"\s+", " ", action.help or "").lower()
    names = "|".join(re.escape(n.lstrip("-")) for n in action.option_strings)
    return bool(
        re.match(r"\[?deprecated\b", text)
        or re.match(r"(this (option|argument|flag)|it) is deprecated", text)
        or (names and re.search(rf"(?<![\w-])-*({names})\)? is deprecated", text))
    )


def accepted_names(parser: argparse.ArgumentParser, action: argparse.Action) -> list[str]:
    """Every option string the parser maps to the action, the ones shown in help first. vLLM 0.33
    registers `--no-enable-x`/`--no-disable-x` but shows only `--enable-x`/`--disable-x`."""
    registered = [s for s, a in parser._option_string_actions.items() if a is action]
    shown = list(action.option_strings)
    return shown + [s for s in registered if s not in shown]


def _bool_names(action: argparse.Action, names: list[str]) -> tuple[list[str], list[str]]:
    """Positive and negative names of a BooleanOptionalAction (or vLLM's EnableDisableAction)."""
    negatives = getattr(action, "negative_option_strings", None)
    if negatives is None:  # plain argparse: each name given is followed by its `--no-` form
        given, i, strings = [], 0, list(action.option_strings)
        while i < len(strings):
            given.append(strings[i])
            nxt = "--no-" + strings[i][2:]
            i += 2 if strings[i].startswith("--") and strings[i + 1 : i + 2] == [nxt] else 1
        negatives = {n for n in names if n not in given}
    return [n for n in names if n not in negatives], [n for n in names if n in negatives]


def choices_of(action: argparse.Action) -> list[str] | None:
    """Choices as strings; a set's (random) order sorted so the catalog is the same each run."""
    if action.choices is None:
        return None
    names = [str(c) for c in action.choices]
    return names if isinstance(action.choices, (list, tuple, range)) else sorted(names)


def describe(parser: argparse.ArgumentParser, action: argparse.Action) -> tuple[str, dict[str, Any]]:
    names = accepted_names(parser, action)
    hidden = [n for n in names if n not in action.option_strings]
    negatives: list[str] = []
    if isinstance(action, argparse.BooleanOptionalAction):
        names, negatives = _bool_names(action, names)
    shown = [n for n in names if n not in hidden]
    long_names = [n for n in shown if n.startswith("--")]
    key = (long_names[0] if long_names else shown[0]).lstrip("-")
    t = _type_callable(parser, action)
    kind = kind_of(parser, action)
    assert kind in KINDS, kind
    entry: dict[str, Any] = {
        "names": shown,
        "dest": action.dest,
        "kind": kind,
        "type_name": type_name(t),
        "choices": choices_of(action),
        "nargs": action.nargs,
        "default": jsonable(action.default),
        "negative": next((n for n in negatives if n not in hidden), negatives[0] if negatives else None),
        "help": first_sentence(action.help),
    }
    if len(negatives) > 1:
        entry["negatives"] = negatives  # every negative form the parser accepts
    if hidden:
        entry["hidden_names"] = hidden  # accepted, not shown in --help
    if action.help == argparse.SUPPRESS:
        entry["hidden"] = True
    if _deprecation_marked(parser, action):
        entry["deprecated"] = True
    return key, entry


def catalog_command(parser: argparse.ArgumentParser, built_by: str) -> dict[str, Any]:
    positionals, options = [], {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            continue
        if not action.option_strings:
            positionals.append({"dest": action.dest, "nargs": action.nargs})
            continue
        key, entry = describe(parser, action)
        if key in options:
            raise SystemExit(f"two options share the key {key!r}: {options[key]['names']} and {entry['names']}")
        options[key] = entry
    return {"built_by": built_by, "positionals": positionals, "options": options}


# Forms that FlexibleArgumentParser.parse_args rewrites before argparse sees them; each is parsed
# for real and the catalog records what it sets (or that it is refused).
SERVE_FORMS = (
    ["some/model", "-O3"],
    ["some/model", "-O", "3"],
    ["some/model", "-O=3"],
    ["some/model", "--optimization-level", "3"],
    ["some/model", "--max_model_len", "32k"],
    ["some/model", "--compilation-config.mode", "3"],
    ["some/model", "-cc.mode=3"],
    ["--model", "some/model"],
)


# Value forms each option that takes a value is given, parsed for real (`vllm serve some/model --OPT
# FORM`, as vLLM's config-file reader passes `OPT: FORM`); the catalog records which the parser
# accepts (with what it makes of them) and which it refuses. provisioner/vllm/flags.py must take
# exactly these: tests/unit/test_spec_holes.py checks it on every recorded form.
VALUE_FORMS = ("7", "-1", "0", "+7", "1_000", "0.5", "-0.5", "1e3", "inf", "-inf", "32k", "32K", "25.6k", "-1k",
               "1M", "1m", "8G", "8g", "8GiB", "8gb", "1.5G", "1.5g", "1T", "1t", "auto", "AUTO", "None", "none", "",
               "true", "abc")
NO_VALUE = "(no value)"  # the option alone: what the config-file reader passes for `OPT: true`
PROBED_KINDS = ("int", "float", "human_int", "bool", "other")


def probes_values(entry: dict[str, Any]) -> bool:
    """Options whose values are worth probing: typed ones without choices, and optional-value ones."""
    if entry["kind"] in ("flag", "bool_optional") or entry["choices"]:
        return False
    return entry["kind"] in PROBED_KINDS or entry["nargs"] == "?"


def value_forms(parser: argparse.ArgumentParser, name: str, dest: str,
                forms: tuple[str, ...] = (*VALUE_FORMS, NO_VALUE)) -> dict[str, Any]:
    """`{"accepts": {form: value set}, "rejects": [form, ...]}`: `vllm serve some/model NAME FORM` parsed."""
    import contextlib
    import io

    accepts, rejects = {}, []
    for form in forms:
        argv = ["serve", "some/model", name] + ([] if form == NO_VALUE else [form])
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                namespace = parser.parse_args(argv)
        except (SystemExit, Exception):  # noqa: BLE001 - a refusal is the answer
            rejects.append(form)
        else:
            accepts[form] = jsonable(getattr(namespace, dest))
    return {"accepts": accepts, "rejects": rejects}


def add_value_forms(parser: argparse.ArgumentParser, options: dict[str, dict[str, Any]]) -> None:
    for key, entry in options.items():
        if probes_values(entry):
            entry["value_forms"] = value_forms(parser, f"--{key}", entry["dest"])


def _diff(value: Any, base: Any) -> Any:
    """What `value` changes in `base`: changed keys only, down nested dicts."""
    if isinstance(value, dict) and isinstance(base, dict):
        return {k: _diff(v, base.get(k)) for k, v in value.items() if v != base.get(k)}
    return value


def parse_forms(parser: argparse.ArgumentParser, forms: tuple[list[str], ...]) -> list[dict[str, Any]]:
    """Parse `vllm serve <form>` for real; record what each form sets, or vLLM's error."""
    import contextlib
    import io

    base = {k: jsonable(v) for k, v in vars(parser.parse_args(["serve", "some/model"])).items()}
    out = []
    for form in forms:
        entry: dict[str, Any] = {"argv": form}
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                ns = vars(parser.parse_args(["serve", *form]))
        except (SystemExit, Exception) as exc:  # noqa: BLE001 - a refusal is the answer
            lines = [ln for ln in err.getvalue().splitlines() if "error" in ln] or [repr(exc)]
            entry["accepted"] = False
            entry["error"] = lines[-1]
        else:
            entry["accepted"] = True
            got = {k: jsonable(v) for k, v in ns.items()}
            entry["sets"] = {k: _diff(v, base.get(k)) for k, v in sorted(got.items()) if v != base.get(k)}
        out.append(entry)
    return out


def wheel_build() -> tuple[str, dict[str, Any]]:
    """(variant, build) of the installed vLLM: the CUDA it is built for, from the wheels' own metadata.

    The chain: vLLM's `Requires-Dist: torch==X` pin, torch's pin of the CUDA runtime it links against
    (`cuda-toolkit[...]==13.0.2`, or `nvidia-cuda-runtime-cu12==...` for CUDA 12 builds), and
    `torch.version.cuda`. The default build (what PyPI serves) has no local version label; another
    variant is published as `<version>+cu129` (the label names it)."""
    import importlib.metadata as metadata

    import torch.version

    vllm_version = metadata.version("vllm")
    local = vllm_version.partition("+")[2]
    torch_pin = next(requirement for requirement in metadata.requires("vllm") or []
                     if re.match(r"torch\s*==", requirement))
    runtime_pins = [requirement for requirement in metadata.requires("torch") or []
                    if requirement.startswith(("cuda-toolkit", "nvidia-cuda-runtime"))]
    cuda = torch.version.cuda
    variant = local or "cu" + cuda.replace(".", "")
    return variant, {
        "cuda": cuda,
        "default": not local,
        "generated": True,
        "torch": torch.version.__version__,
        "evidence": [
            f"vllm {vllm_version} METADATA: Requires-Dist: {torch_pin}",
            *(f"torch {metadata.version('torch')} METADATA: Requires-Dist: {pin}" for pin in runtime_pins),
            f"torch.version.cuda = '{cuda}' (torch.__version__ = '{torch.version.__version__}')",
        ],
    }


def merged_builds(previous: dict[str, Any] | None, variant: str, build: dict[str, Any]) -> dict[str, Any]:
    """The catalog's builds: the one read from this venv, and those recorded before for other variants."""
    kept = {name: entry for name, entry in ((previous or {}).get("builds") or {}).items() if name != variant}
    if build["default"]:
        kept = {name: {**entry, "default": False} for name, entry in kept.items()}
    return dict(sorted({**kept, variant: build}.items()))


def make_catalog() -> dict[str, Any]:
    _prepare_argv()
    platform = _set_cpu_platform()
    import vllm

    parser, sources = build_cli_parser()
    again, _ = build_cli_parser()  # a second build shows the defaults made anew each run
    commands = {}
    for name, path in (("serve", ("serve",)), ("bench serve", ("bench", "serve"))):
        commands[name] = catalog_command(subparser(parser, *path), sources[name])
        other = catalog_command(subparser(again, *path), sources[name])["options"]
        for key, entry in commands[name]["options"].items():
            if entry["default"] != other[key]["default"]:  # e.g. bench's request-id-prefix (a uuid)
                entry["default"] = None
                entry["default_varies"] = True
    commands["serve"]["argv_forms"] = parse_forms(parser, SERVE_FORMS)
    add_value_forms(parser, commands["serve"]["options"])
    variant, build = wheel_build()
    return {
        "vllm_version": vllm.__version__.partition("+")[0],
        "builds": {variant: build},
        "generated_by": f"python -m provisioner.vllm.make_catalog (vLLM's own parser, {sources['serve']})",
        "platform": platform,
        "python": ".".join(map(str, sys.version_info[:2])),
        "commands": commands,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m provisioner.vllm.make_catalog", description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="folder that receives vllm-<version>.json")
    ns = ap.parse_args(argv)
    catalog = make_catalog()
    ns.out.mkdir(parents=True, exist_ok=True)
    path = ns.out / f"vllm-{catalog['vllm_version']}.json"
    previous = json.loads(path.read_text()) if path.is_file() else None
    (variant, build), = catalog["builds"].items()
    catalog["builds"] = merged_builds(previous, variant, build)
    partial = path.with_name(f".{path.name}.partial")  # renamed over the catalog: never half a file
    partial.write_text(json.dumps(catalog, indent=1, sort_keys=True, ensure_ascii=False) + "\n")
    partial.replace(path)
    counts = ", ".join(f"{cmd}: {len(c['options'])} options" for cmd, c in catalog["commands"].items())
    print(f"wrote {path} ({counts})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
