"""Per-server log files: where they go, how they are created, and reading their tail."""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from app.errors import NotPermitted

if TYPE_CHECKING:
    from app.config import Config

TAIL_LINES = 20


def log_dir(config: Config) -> Path:
    """llama.log_dir, else servers/ beside the database."""
    return Path(config.llama.log_dir).expanduser() if config.llama.log_dir else config.db_path.parent / "servers"


def open_log(directory: Path, server_id: int) -> tuple[str, int]:
    """Create (or append to) <dir>/<id>.log; returns (path, fd). In a setgid directory (the shared
    install) the directory is 2770 and the file 0660, so the group can read the logs and stop servers."""
    shared = _setgid(directory.parent) if not directory.exists() else _setgid(directory)
    if not directory.exists():
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise NotPermitted(f"can't create the server log directory {directory}: {error.strerror}") from None
        if shared:
            try:
                os.chmod(directory, 0o2770)
            except OSError:
                pass
    path = directory / f"{server_id}.log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o660 if shared else 0o640)
    if shared:
        try:
            os.fchmod(fd, 0o660)
        except OSError:
            pass
    return str(path), fd


def _setgid(directory: Path) -> bool:
    try:
        return bool(directory.stat().st_mode & stat.S_ISGID)
    except OSError:
        return False


def tail(path: str, lines: int = TAIL_LINES, max_bytes: int = 64 * 1024) -> list[str]:
    """The last `lines` lines of a log (decoded leniently); [] when it cannot be read."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except OSError:
        return []
    text = data.decode("utf-8", "replace")
    if size > max_bytes:
        text = text.split("\n", 1)[-1]  # drop the partial first line
    return text.rstrip("\n").split("\n")[-lines:] if text.strip() else []


def follow(
    path: str, *, start_lines: int = 50, until: Callable[[], bool] = lambda: False, poll_s: float = 0.25,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[str]:
    """The last `start_lines` lines, then each new line as it is written (like tail -f).

    Stops once `until()` is true and the file has stopped growing; never blocks longer than `poll_s`
    between checks, so a UI can drive it from a worker thread.
    """
    yield from tail(path, start_lines)
    try:
        position = os.path.getsize(path)
    except OSError:
        position = 0
    pending, finishing = b"", False
    while True:
        try:
            with open(path, "rb") as f:
                f.seek(position)
                chunk = f.read()
        except OSError:
            chunk = b""
        if chunk:
            position += len(chunk)
            pending += chunk
            *complete, pending = pending.split(b"\n")
            for line in complete:
                yield line.decode("utf-8", "replace")
            continue
        if finishing:
            if pending:
                yield pending.decode("utf-8", "replace")
            return
        if until():
            finishing = True  # one more read: the last lines may land just before the state changes
            continue
        sleep(poll_s)
