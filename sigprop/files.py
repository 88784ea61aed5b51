"""Whole-file writes: a temp file in the target's directory, renamed over the target, so a
reader (or a crash) never sees half a file.  No torch."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable

from sigprop.errors import SigpropError


def _umask_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def atomic_write(target: Path, write: Callable[[str], None], suffix: str = ".tmp") -> None:
    """Call ``write(tmp_path)`` then rename tmp over ``target`` (mode as a new file would get)."""
    target = Path(target).resolve()
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=suffix)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, _umask_mode())
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def check_target(path: Path, field: str, append: bool = False) -> Path:
    """A file sigprop will write (``atomic_write``) or append to (``append``: a sweep's JSON
    lines), checked before any work: its directory exists and takes a new file (a temp file is
    made there and removed: a read-only directory, a read-only file system, a directory such as
    /proc that holds no files, all fail here, whoever runs it), and the path, where it exists, is
    a regular file -- a named pipe or a device is refused (a whole-file write replaces it by a
    rename; sigprop never writes a result into a stream: write to stdout and pipe that instead).
    The resolved path, or one ``SigpropError`` naming ``field``."""
    target = Path(path).resolve()
    if target.is_dir():
        raise SigpropError(f"{path} is a directory", field=field)
    parent = target.parent
    if not parent.is_dir():
        what = f"{parent} is not a directory" if parent.exists() else f"directory {parent} does not exist"
        raise SigpropError(what, field=field)
    if target.exists() and not target.is_file():
        raise SigpropError(
            f"{path} is not a regular file (a named pipe or a device): sigprop writes whole files; give "
            "a regular file's path",
            field=field,
        )
    try:
        fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{target.name}.", suffix=".check")
        os.close(fd)
        os.unlink(tmp)
        if append and target.exists():
            os.close(os.open(target, os.O_WRONLY | os.O_APPEND))
    except OSError as exc:
        where = target if append and target.exists() else f"a file in {parent}"
        raise SigpropError(f"cannot write {where}: {exc.strerror or exc}", field=field) from None
    return target
