"""The package's import map points down: each module imports only from its own layer or the layers below.

Top to bottom: the CLI; the tuner (over the bench); the commands' library (apply, audit, bench, the schema docs); the plan;
`validation`: the roles read as data, the memory plan, the preflight on it and the gate every command passes; `fleet`: the
inventory, host selection, the remote layer (SSH) and the monitoring configuration; the spec; the vLLM and GPU libraries (below
the spec: they know nothing of it); `base`: the pieces everything uses. A package is a layer (or part of one): no module sits
at the top of provisioner/ but the plan and the schema docs, each a layer's only module.
"""

from __future__ import annotations

import ast

from provisioner.base.paths import PACKAGE_DIR

LAYERS = [  # bottom first: a module's layer is the first entry that names it or a package above it
    ["provisioner.base", "provisioner.ansible_plugins"],
    ["provisioner.vllm", "provisioner.gpu"],
    ["provisioner.spec"],
    ["provisioner.fleet"],
    ["provisioner.validation"],
    ["provisioner.plan"],
    ["provisioner.apply", "provisioner.audit", "provisioner.bench", "provisioner.spec_docs"],
    ["provisioner.tune"],
    ["provisioner.cli"],
]


def layer_of(module: str) -> int:
    for index, names in enumerate(LAYERS):
        if any(module == name or module.startswith(name + ".") for name in names):
            return index
    raise LookupError(f"{module} is in no layer of tests/unit/test_layers.py: add it where it belongs")


def package_modules() -> dict[str, ast.Module]:
    modules = {}
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        relative = path.relative_to(PACKAGE_DIR.parent).with_suffix("")
        if "_content" in relative.parts:
            continue
        name = ".".join(relative.parts).removesuffix(".__init__")
        if name != "provisioner":
            modules[name] = ast.parse(path.read_text(encoding="utf-8"))
    return modules


def imported(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, module) of every `from provisioner… import` and `import provisioner…`, lazy ones included."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("provisioner"):
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name.startswith("provisioner")]
    return found


def test_every_module_is_in_a_layer():
    for name in package_modules():
        layer_of(name)


def test_no_import_runs_back_up():
    upward = [
        f"{name}:{line} imports {target} (layer {layer_of(target)} above {layer_of(name)})"
        for name, tree in package_modules().items()
        for line, target in imported(tree)
        if target != "provisioner" and layer_of(target) > layer_of(name)
    ]
    assert upward == []



def test_the_top_of_the_package_holds_packages_by_layer():
    """Modules live in their layer's package; only a layer of one module keeps it at the top."""
    flat = sorted(path.stem for path in PACKAGE_DIR.glob("*.py") if path.stem != "__init__")
    assert flat == ["plan", "spec_docs"], f"put {flat} in the package of their layer (LAYERS above)"
