"""The example specs stay valid, and their committed inventories stay what the generator writes.

After a deliberate change to the generator or to an example, refresh the committed files:
    UPDATE_EXAMPLES=1 .venv/bin/python -m pytest tests/unit/test_examples.py
Each inventory is generated where it is committed (inventory/examples/<spec name>/): the files the
spec names are written relative to it, so nothing in them depends on where the repository is cloned.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from provisioner.base.paths import CONTENT_ROOT, EXAMPLES_DIR
from provisioner.fleet.inventory import build_inventory, render_file
from provisioner.spec import load_spec

EXAMPLE_SPECS = sorted(EXAMPLES_DIR.glob("*.yml"))


def test_the_three_seed_examples_exist():
    assert [path.stem for path in EXAMPLE_SPECS] == ["seed1-3090", "seed2-4070", "seed3-2x4090"]


def generated(spec_path: Path, folder: Path) -> dict[str, str]:
    """The inventory's files as `provision inventory -o folder` writes them."""
    spec = load_spec(spec_path)
    return {relative: render_file(spec, data) for relative, data in sorted(build_inventory(spec, folder).items())}


def committed(folder: Path) -> dict[str, str]:
    return {path.relative_to(folder).as_posix(): path.read_text() for path in sorted(folder.rglob("*.yml"))}


@pytest.mark.parametrize("spec_path", EXAMPLE_SPECS, ids=lambda path: path.stem)
def test_committed_inventory_matches_the_generator(spec_path):
    folder = EXAMPLES_DIR / spec_path.stem
    expected = generated(spec_path, folder)
    if os.environ.get("UPDATE_EXAMPLES") == "1":
        shutil.rmtree(folder, ignore_errors=True)
        for relative, text in expected.items():
            (folder / relative).parent.mkdir(parents=True, exist_ok=True)
            (folder / relative).write_text(text)
    assert committed(folder) == expected, (
        f"{folder} is out of date: run UPDATE_EXAMPLES=1 .venv/bin/python -m pytest tests/unit/test_examples.py"
    )


@pytest.mark.parametrize("spec_path", EXAMPLE_SPECS, ids=lambda path: path.stem)
def test_the_inventory_names_no_folder_of_this_machine(spec_path):
    """The API key files are in the checkout: named from the inventory's folder, not by this machine's path."""
    text = "".join(generated(spec_path, EXAMPLES_DIR / spec_path.stem).values())
    assert "api_key_file: '{{ inventory_dir }}/../secrets/" in text
    for folder in {str(CONTENT_ROOT), str(CONTENT_ROOT.resolve()), str(Path.home())}:
        assert folder not in text


def test_seed2_shares_fill_the_card_to_the_limit_and_no_further():
    spec = load_spec(EXAMPLES_DIR / "seed2-4070.yml")
    shares = {instance.name: instance.gpu_memory_utilization for instance in spec.instances}
    assert shares == {"reranker": 0.20, "embed": 0.25, "chat": 0.50}
    assert sum(shares.values()) <= spec.hosts[0].gpus.memory_share_limit
    chat = spec.instances[2]
    assert chat.options["max-num-batched-tokens"] == 4096


def test_seed1_settings():
    spec = load_spec(EXAMPLES_DIR / "seed1-3090.yml")
    (qwen,) = spec.instances
    assert spec.hosts[0].settings.swappiness == 1
    assert qwen.model == "Qwen/Qwen2.5-7B-Instruct" and qwen.gpu_memory_utilization == 0.95
    assert {key: qwen.options[key] for key in ("max-model-len", "block-size", "max-num-seqs")} == {
        "max-model-len": 4096, "block-size": 16, "max-num-seqs": 128,
    }
