"""Writing output so that a failure leaves no partial result: all files or none.

Everything is first written into a temporary folder beside the destination (same filesystem,
so the final step is a rename), then moved into place. A destination folder that does not
exist yet appears at once, complete (one rename); into an existing folder each file is moved
with os.replace, which replaces it atomically. Whatever fails while writing (a name the
filesystem refuses, a full disk, no permission) fails before anything at the destination changed.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


def _missing_parents(path: Path) -> list[Path]:
    """The folders above `path` that do not exist yet, outermost first."""
    missing = []
    for parent in path.absolute().parents:
        if parent.exists():
            break
        missing.append(parent)
    return missing[::-1]


def _umask_mode(mode: int) -> int:
    umask = os.umask(0)
    os.umask(umask)
    return mode & ~umask


def write_folder(destination: str | Path, files: dict[str, str], private: bool = False) -> list[Path]:
    """Write `files` (relative path → text) under `destination`, all or none; returns their paths.

    Files already in `destination` that `files` does not name are left as they are. `private`: the files
    0600 and the folders they are in (`destination` too) 0700, whatever the umask: only their owner reads them."""
    destination = Path(destination)
    if destination.exists() and not destination.is_dir():
        raise NotADirectoryError(20, "not a folder", str(destination))
    created = _missing_parents(destination)
    destination.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{destination.name}.", suffix=".partial", dir=destination.parent))
    try:
        for relative, text in files.items():
            path = staging / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        if private:
            _make_private(staging, files)
        if destination.exists():
            _check_replaceable(destination, files)
            for relative in files:
                (destination / relative).parent.mkdir(parents=True, exist_ok=True)
                os.replace(staging / relative, destination / relative)
            if private:
                _make_private(destination, files)
        else:
            if not private:
                staging.chmod(_umask_mode(0o777))  # mkdtemp made it 0700
            staging.rename(destination)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        _remove_empty(created)
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return [destination / relative for relative in files]


def _make_private(folder: Path, files: dict[str, str]) -> None:
    """The files under `folder` 0600, the folders they are in 0700 (`folder` too)."""
    for relative in files:
        (folder / relative).chmod(0o600)
        for parent in Path(relative).parents:
            (folder / parent).chmod(0o700)


def _check_replaceable(destination: Path, files: dict[str, str]) -> None:
    """Before the first move: each file's place in `destination` takes a file (no folder there, no
    file where a folder must be, folders we may write to), so that the moves do not stop half-way."""
    for relative in files:
        target = destination / relative
        if target.is_dir():
            raise IsADirectoryError(21, "a folder is in the way", str(target))
        folder = target.parent
        while not folder.exists():
            folder = folder.parent
        if not folder.is_dir():
            raise NotADirectoryError(20, "a file is in the way of a folder", str(folder))
        if not os.access(folder, os.W_OK | os.X_OK):
            raise PermissionError(13, "Permission denied", str(folder))


def write_file(destination: str | Path, data: bytes) -> None:
    """Write one file all or nothing: a temporary file beside it, renamed over it."""
    destination = Path(destination)
    created = _missing_parents(destination)
    destination.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{destination.name}.", suffix=".partial",
                                             dir=destination.parent)
    try:
        with os.fdopen(descriptor, "wb") as file:
            file.write(data)
        os.chmod(temporary, _umask_mode(0o666))  # mkstemp made it 0600
        os.replace(temporary, destination)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        _remove_empty(created)
        raise


def _remove_empty(folders: list[Path]) -> None:
    """Remove the folders we created (outermost first in the list), innermost first, while empty."""
    for folder in reversed(folders):
        try:
            folder.rmdir()
        except OSError:
            return
