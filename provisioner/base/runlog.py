"""The log every apply keeps: what the console showed and the summary, secrets redacted, under
$XDG_STATE_HOME/vllm-provision/runs/ (default ~/.local/state/vllm-provision/runs/)."""

from __future__ import annotations

import os
from datetime import datetime, timezone
from pathlib import Path
from typing import IO

from provisioner.base.secrets import redact


def runs_dir(environ: dict[str, str] | None = None) -> Path:
    environ = os.environ if environ is None else environ
    state = environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "vllm-provision" / "runs"


class RunLog:
    """A text file, written line by line as the run goes; each write is redacted first.

    Usable as the `file` of a rich Console (it has write and flush)."""

    def __init__(self, spec_name: str, now: datetime | None = None, folder: Path | None = None):
        folder = folder or runs_dir()
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        stamp = (now or datetime.now(timezone.utc)).strftime("%Y%m%dT%H%M%SZ")
        self._file: IO[str] = self._create(folder, f"{stamp}-{spec_name}")

    def _create(self, folder: Path, stem: str) -> IO[str]:
        for attempt in range(1, 100):
            path = folder / (f"{stem}.log" if attempt == 1 else f"{stem}-{attempt}.log")
            try:
                file = open(path, "x", encoding="utf-8")  # noqa: SIM115 - kept open for the whole run
            except FileExistsError:
                continue
            os.chmod(path, 0o600)
            self.path = path
            return file
        raise FileExistsError(folder / f"{stem}.log")

    def write(self, text: str) -> int:
        self._file.write(redact(text))
        self._file.flush()
        return len(text)

    def flush(self) -> None:
        self._file.flush()

    def isatty(self) -> bool:
        return False

    def close(self) -> None:
        self._file.close()
