"""The collection's tarball holds the collection only (issue 36, point 3): what `ansible-galaxy collection build`
makes from this checkout is listed, against the parts galaxy.yml means to ship."""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOP_LEVEL = {"roles", "playbooks", "plugins", "meta", "tests", "README.md", "LICENSE", "CHANGELOG.md",
             "MANIFEST.json", "FILES.json"}  # the last two: ansible-galaxy's own


def test_the_tarball_holds_the_collection_and_nothing_else(tmp_path):
    subprocess.run([Path(sys.executable).with_name("ansible-galaxy"), "collection", "build", "--output-path",
                    str(tmp_path), str(ROOT)], check=True, capture_output=True, text=True)
    (tarball,) = tmp_path.glob("vllm_provision-gpu_host-*.tar.gz")
    with tarfile.open(tarball) as archive:
        names = archive.getnames()
        files = [member.name for member in archive.getmembers() if member.isfile()]
    assert {name.split("/", 1)[0] for name in names} == TOP_LEVEL
    strays = [name for name in names if any(part.startswith(".") or part == "__pycache__" for part in name.split("/"))
              or name.endswith(".pyc")]
    assert strays == []
    # of tests/, only ansible-test's ignore file (tests/sanity/): the project's own tests stay out
    assert [name for name in files if name.startswith("tests/")] == ["tests/sanity/ignore-2.19.txt"]
    # every role and the collection's plugins are in it
    roles = {path.name for path in (ROOT / "roles").iterdir() if path.is_dir()}
    assert {name.split("/")[1] for name in names if name.startswith("roles/") and name.count("/") >= 1} >= roles
    assert "plugins/modules" in names and "meta/runtime.yml" in names
