"""The checks of an instance's env file and `vllm serve --config` file, shared by its unit
(test_vllm_service.py) and its container (test_vllm_container.py): the same files, written by the same role."""

from __future__ import annotations

from typing import Any

from provisioner.audit.checks import ABSENT, Audit


def expect_env_file_mode(audit: Audit, label: str, env_file: dict[str, Any], stat: tuple[str, str] | None) -> None:
    audit.expect(f"{label} mode", env_file["mode"], stat[0] if stat else ABSENT)


def expect_env_file_owner(audit: Audit, label: str, env_file: dict[str, Any], stat: tuple[str, str] | None) -> None:
    audit.expect(f"{label} owner", env_file["owner"], stat[1] if stat else ABSENT)


def expect_env_file_content(audit: Audit, label: str, env_file: dict[str, Any], sha256: str | None) -> None:
    audit.expect(f"{label} content", f"as rendered (sha256 {env_file['sha256'][:12]})",
                 f"sha256 {sha256[:12]}" if sha256 else ABSENT, passed=sha256 == env_file["sha256"])


def expect_config_file(audit: Audit, name: str, config: dict[str, Any], actual: str | None) -> None:
    check = f"{name}: config file {config['path']}"
    expected = f"as rendered ({len(config['content'].splitlines())} lines)"
    if actual is None:
        audit.expect(check, expected, ABSENT, passed=False)
    same = actual == config["content"]
    audit.expect(check, expected, expected if same else first_difference(config["content"], actual), passed=same)


def first_difference(expected: str, actual: str) -> str:
    """Where two texts first differ: "line 7: 'block-size: 32' instead of 'block-size: 16'"."""
    wanted, found = expected.splitlines(), actual.splitlines()
    for number, (line, other) in enumerate(zip(wanted, found), start=1):
        if line != other:
            return f"line {number}: {other!r} instead of {line!r}"
    if len(wanted) != len(found):
        extra = found[len(wanted)] if len(found) > len(wanted) else None
        return (f"line {len(wanted) + 1}: {extra!r} added" if extra is not None
                else f"ends at line {len(found)}; missing {wanted[len(found)]!r}")
    return "differs in line endings or a final newline"
