"""A command started as a terminal starts its foreground job: SIGINT and SIGQUIT at their defaults.

A test run from a script in the background (CI's parts run side by side: `pytest … &`) inherits both
ignored, and a Python started so keeps SIGINT ignored: a Ctrl-C sent to it in a test would do nothing.
"""

from __future__ import annotations

import signal


def as_from_a_terminal() -> None:
    """preexec_fn for subprocess.Popen (called from the main thread): SIGINT and SIGQUIT at their defaults."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)
