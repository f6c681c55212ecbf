"""No process the package starts inherits the user's stdin.

ssh makes its stdin non-blocking while a session is open and puts it back when it exits; killed mid-session
(a host gone silent, a timeout) it leaves it non-blocking. That stdin is the user's terminal: their shell
then reads "Resource temporarily unavailable" and every Ansible after it stops with "Ansible requires
blocking IO on stdin". So every child gets stdin= (most: /dev/null) or input=. The run that goes wrong
without it is in tests/integration/test_faults.py (an audit of a host that went silent).
"""

from __future__ import annotations

import ast

from provisioner.base.paths import PACKAGE_DIR

STARTS = {"run", "Popen", "check_output", "call", "check_call"}


def children_without_stdin() -> list[str]:
    found = []
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in STARTS
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "subprocess"
                    and not {keyword.arg for keyword in node.keywords} & {"stdin", "input"}):
                found.append(f"{path.relative_to(PACKAGE_DIR.parent)}:{node.lineno}")
    return found


def test_every_process_the_package_starts_is_given_its_stdin():
    assert children_without_stdin() == []


def test_the_scan_finds_a_call_that_leaves_stdin_to_the_child(tmp_path, monkeypatch):
    package = tmp_path / "provisioner"
    package.mkdir()
    (package / "careless.py").write_text("import subprocess\n\nsubprocess.run(['ssh', 'host', 'true'], timeout=5)\n"
                                         "subprocess.run(['ssh', 'host', 'true'], stdin=subprocess.DEVNULL)\n")
    monkeypatch.setattr(f"{__name__}.PACKAGE_DIR", package)
    assert children_without_stdin() == ["provisioner/careless.py:3"]
