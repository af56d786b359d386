"""`board backup PATH` also copies the history (board.history.db) to PATH's history name, PATH with `.history.db`.

The history is a file of its own (app.history.store says why), so app.store.backup's copy, which opens and checks
a board database, is not for it. This copy takes one read snapshot of the live history with SQLite's backup API
into memory, checks it (integrity_check), and writes it through one file descriptor that is never reopened by
name: an unnamed file in PATH's directory (O_TMPFILE), linked into place only once it is whole and synced. So a
member who may write that directory cannot swap the copy for a link of theirs. An existing copy is replaced only
with --force, and then by removing its name (never writing through it) and linking the new file in its place.
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from app.errors import BadInput, BoardError
from app.store.backup import _refuse_live_files
from app.store.db import _refuse_planted_links


@dataclass(frozen=True, slots=True)
class HistoryBackup:
    path: Path
    bytes: int
    integrity: str

    def summary(self, source: Path) -> str:
        return (f"backed up the history {source} to {self.path}: {self.bytes / 2**20:.1f} MiB,"
                f" integrity {self.integrity}")


def history_target(target: Path) -> Path:
    """Where the history's copy goes beside the board's: board-2026-11-29.db -> board-2026-11-29.history.db (the
    live files' own naming, app.config.Config.history_path)."""
    return target.with_name(target.stem + ".history.db")


def check_history_target(source: Path, target: Path, *, force: bool) -> None:
    """Refuse a history target before anything is copied, so `board backup` does all of its work or none."""
    _refuse_live_files(source, target)
    if target.is_dir():
        raise BadInput(f"{target} is a directory; the history's copy needs that name free")
    if (target.exists() or target.is_symlink()) and not force:
        raise BadInput(f"{target} already exists (the history's copy beside the backup); pick another name,"
                       " or pass --force to replace both")
    for suffix in ("-wal", "-shm", "-journal"):
        if Path(f"{target}{suffix}").exists():
            raise BadInput(f"{target}{suffix} exists (a database was in use there); remove it or pick another name")
    if target.parent.is_dir():  # (one that is not there is the board's copy's to refuse, first)
        os.close(_unnamed_file(target.parent))  # it takes an unnamed file (a local disk, writable): else say so now


def _unnamed_file(directory: Path, *, dir_fd: int | None = None) -> int:
    try:
        return os.open("." if dir_fd is not None else directory, os.O_TMPFILE | os.O_WRONLY, 0o600, dir_fd=dir_fd)
    except OSError as error:
        raise BadInput(f"can't write the history's copy in {directory} ({error.strerror});"
                       " pick a directory on a local disk you can write") from None


def backup_history(source: Path, target: Path, *, force: bool = False) -> HistoryBackup | None:
    """Copy the live history at `source` to `target`; None when there is no history (the service never sampled)."""
    source, target = Path(source), Path(target)
    if not source.is_file():
        return None
    check_history_target(source, target, force=force)
    _refuse_planted_links(source)
    data, integrity = _snapshot(source)
    if integrity != "ok":
        raise BoardError(f"the history {source} fails integrity_check ({integrity}); nothing was written for it")
    # The directory held open, so every step below acts in this one, whatever its path names meanwhile.
    try:
        directory = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as error:
        raise BadInput(f"can't write the history's copy in {target.parent} ({error.strerror})") from None
    try:
        fd = _unnamed_file(target.parent, dir_fd=directory)
    except BadInput:
        os.close(directory)
        raise
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
        _link(fd, directory, target, force)
        os.fsync(directory)
    finally:
        os.close(fd)
        os.close(directory)
    return HistoryBackup(target, len(data), integrity)


def _snapshot(source: Path) -> tuple[bytes, str]:
    """The history as it is at one instant, as the bytes of a database file, and its integrity_check."""
    src = sqlite3.connect(source, isolation_level=None)
    copy = sqlite3.connect(":memory:", isolation_level=None)
    try:
        src.execute("BEGIN")  # one read snapshot; the sampler keeps writing beside it (WAL)
        try:
            src.backup(copy)
        finally:
            src.execute("COMMIT")
        integrity = "; ".join(row[0] for row in copy.execute("PRAGMA integrity_check").fetchall())
        data = bytearray(copy.serialize())
        # The header's file format versions (bytes 18 and 19) say WAL, as the live file's do; 1 and 1 make the copy
        # a rollback-journal file, as the board's copy is, so that reading it leaves no -wal and -shm beside it.
        data[18:20] = b"\x01\x01"
        return bytes(data), integrity
    except sqlite3.Error as error:
        raise BoardError(f"can't read the history {source} ({error}); board doctor says more") from None
    finally:
        src.close()
        copy.close()


def _link(fd: int, directory: int, target: Path, force: bool) -> None:
    """Give the unnamed file its name; never replaces an existing name unless `force`, and never follows one."""
    if force:
        try:
            os.unlink(target.name, dir_fd=directory)  # the name only: a link planted there is removed, not followed
        except FileNotFoundError:
            pass
    try:
        # linkat(AT_SYMLINK_FOLLOW) on the descriptor's /proc link names the unnamed file (a dir_fd makes os.link
        # call linkat; plain link() would link the /proc symlink itself)
        os.link(f"/proc/self/fd/{fd}", target.name, dst_dir_fd=directory, follow_symlinks=True)
    except FileExistsError:
        raise BadInput(f"{target} already exists (the history's copy beside the backup); pick another name,"
                       " or pass --force to replace both") from None
