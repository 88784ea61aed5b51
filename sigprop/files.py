"""Whole-file writes: a temp file in the target's directory, renamed over the target, so a
reader (or a crash) never sees half a file.  No torch."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable


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
