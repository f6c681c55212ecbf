"""What every test shares: the CLI's click command, built once; and a check that every test leaves the stdin
that pytest's children share as it found it: blocking.

A child killed mid-session with that stdin (an ssh, say) leaves it non-blocking, and every Ansible run
after it, in whatever test, stops with "Ansible requires blocking IO on stdin". The test that did it fails
here, by name, and the tests after it run on a blocking stdin again.
"""

from __future__ import annotations

import functools
import os

import pytest
import typer.testing

# CliRunner.invoke builds the click command from the typer app on every call: ~0.25 s of inspecting every
# command's signature, most of a CLI test's time (2600 of them in the hostile corpus). The app never changes
# while the tests run, so its click command is built once.
typer.testing._get_command = functools.cache(typer.testing._get_command)


@pytest.fixture(autouse=True)
def stdin_left_blocking():
    yield
    if not os.get_blocking(0):
        os.set_blocking(0, True)
        pytest.fail("this test left the stdin its children share non-blocking (a child killed mid-session "
                    "with it: give such children stdin=subprocess.DEVNULL)")
