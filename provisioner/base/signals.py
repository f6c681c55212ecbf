"""SIGTERM and SIGHUP stop a long command as Ctrl-C does: they raise KeyboardInterrupt, so its `finally` and
`except KeyboardInterrupt` run (apply reports how far it got; bench restores the instance's config); and what
puts things back runs with the three of them held."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

STOPPING = (signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def signals_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP raise KeyboardInterrupt (named after the signal) in the main thread;
    elsewhere than the main thread, nothing changes (Python sets handlers there only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = {signum: signal.signal(signum, interrupt) for signum in STOPPING}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Ctrl-C, SIGTERM and SIGHUP ignored within the block (the main thread's; elsewhere nothing changes): what it
    puts back runs to its end."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, signal.SIG_IGN) for signum in (signal.SIGINT, *STOPPING)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
