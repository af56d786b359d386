"""`board backup PATH`: a consistent copy of the live database, made with SQLite's online backup API.

The copy is taken from one read snapshot: the source connection opens a read transaction first
and holds it for every backup step, so writers carry on (WAL lets them) and the copy is the
database exactly as it was at that instant, never a mix. Without the held snapshot SQLite
restarts a stepwise backup whenever another process commits, which under steady writes may
never finish.

The copy is made in memory (the bookings' file is small: the history keeps its own), switched to a
rollback journal (one self-contained file) and checked (integrity_check and the audit chain). Then
it is written through the descriptor of a new file beside PATH, nameless where the filesystem allows
(O_TMPFILE), synced, and given PATH through that descriptor (/proc/self/fd). Nothing is ever opened
again by name, so a directory whose owner swaps a temporary name for a symlink (a member's, backed up
by root) gets nothing written through it. An existing PATH is never replaced without force=True.
"""

from __future__ import annotations

import errno
import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from app.errors import BadInput, BoardError
from app.store import events
from app.store.db import connect

PAGES_PER_STEP = 1024  # 4 MiB at SQLite's default page size; smaller DBs go in one step, silently

Progress = Callable[[int, int], None]  # (pages copied, pages in all)


@dataclass(frozen=True, slots=True)
class BackupResult:
    path: Path
    pages: int
    page_size: int
    bookings: int
    events: int
    integrity: str
    first_broken_event: int | None

    def summary(self, source: Path) -> str:
        size = self.pages * self.page_size / 2**20
        chain = (f"audit chain intact ({self.events} events)" if self.first_broken_event is None
                 else f"audit chain broken at event {self.first_broken_event} (as in the live database; see board doctor)")
        return (f"backed up {source} to {self.path}: {self.pages} pages ({size:.1f} MiB), {self.bookings} bookings,"
                f" integrity {self.integrity}, {chain}")


def backup(source: Path, target: Path, *, force: bool = False, progress: Progress | None = None,
           pages_per_step: int = PAGES_PER_STEP) -> BackupResult:
    """Copy the database at `source` to `target`; raises BadInput for a target it may not or cannot write."""
    source, target = Path(source), Path(target)
    refuse_live_files(source, target)
    if target.is_dir():
        raise BadInput(f"{target} is a directory; give the backup a file name, e.g. {target / 'board.db'}")
    if target.exists() and not force:
        raise BadInput(f"{target} already exists; pick another name, or pass --force to replace it")
    if not target.parent.is_dir():
        raise BadInput(f"the directory {target.parent} does not exist; create it first")
    for suffix in ("-wal", "-shm", "-journal"):
        if Path(f"{target}{suffix}").exists():
            raise BadInput(f"{target}{suffix} exists (a database was in use there); remove it or pick another name")

    src = connect(source, create=False)
    try:
        result, image = _copy(src, progress, pages_per_step)
    finally:
        src.close()
    write_new_file(image, target, force=force)
    if result.integrity != "ok":
        raise BoardError(f"copied to {target}, but the copy fails integrity_check ({result.integrity});"
                         " the live database may be damaged: run board doctor")
    return replace(result, path=target)


def refuse_live_files(source: Path, target: Path) -> None:
    """The target must not be the database or one of SQLite's files beside it, however it is spelled.

    Writing the copy over `board.db-wal` (or a link to it) would replace the live write-ahead log:
    SQLite would then discard or misread the newest commits. Paths are compared resolved, so a
    symlink, `..` or a doubled slash does not hide the live file; an existing file is also compared
    by inode, which catches a hard link.
    """
    real_target = os.path.realpath(target)
    for suffix in ("", "-wal", "-shm", "-journal"):
        for own in {Path(f"{source}{suffix}"), Path(f"{os.path.realpath(source)}{suffix}")}:
            same = os.path.realpath(own) == real_target
            if not same:
                try:
                    same = os.path.samefile(own, target)
                except OSError:  # one of them does not exist
                    same = False
            if same:
                what = "the live database itself" if not suffix else f"the live database's own {suffix[1:]} file ({own})"
                raise BadInput(f"{target} is {what}; back it up somewhere else")


def _copy(src: sqlite3.Connection, progress: Progress | None, pages_per_step: int) -> tuple[BackupResult, bytes]:
    """The database as one read snapshot, copied into memory and checked: (what it holds, the file's bytes)."""
    with snapshot(src, progress, pages_per_step) as dst:
        integrity = "; ".join(row[0] for row in dst.execute("PRAGMA integrity_check").fetchall())
        broken = events.first_broken(dst) if integrity == "ok" else None
        result = BackupResult(
            path=Path(),
            pages=dst.execute("PRAGMA page_count").fetchone()[0],
            page_size=dst.execute("PRAGMA page_size").fetchone()[0],
            bookings=dst.execute("SELECT count(*) FROM bookings").fetchone()[0] if integrity == "ok" else 0,
            events=dst.execute("SELECT count(*) FROM events").fetchone()[0] if integrity == "ok" else 0,
            integrity=integrity,
            first_broken_event=broken,
        )
        return result, file_image(dst)


@contextmanager
def snapshot(src: sqlite3.Connection, progress: Progress | None = None,
             pages_per_step: int = PAGES_PER_STEP) -> Iterator[sqlite3.Connection]:
    """An in-memory copy of the database `src` holds, taken from one read snapshot (writers carry on beside it)."""
    dst = sqlite3.connect(":memory:", isolation_level=None)
    try:
        shown = -1

        def report(status: int, remaining: int, total: int) -> None:
            nonlocal shown
            if progress is None or total <= pages_per_step:
                return
            tenth = (total - remaining) * 10 // total
            if tenth != shown:  # at most about ten lines, however large the database
                shown = tenth
                progress(total - remaining, total)

        src.execute("BEGIN")  # one read snapshot for the whole copy
        try:
            src.execute("SELECT count(*) FROM sqlite_master").fetchone()
            src.backup(dst, pages=pages_per_step, progress=report)
        finally:
            src.execute("COMMIT")
        yield dst
    finally:
        dst.close()


def file_image(db: sqlite3.Connection) -> bytes:
    """The bytes of a database file holding what `db` holds, as one self-contained (rollback-journal) file."""
    image = bytearray(db.serialize())
    # The header's write and read versions (file format, offsets 18 and 19): 1 is a rollback journal, 2 WAL,
    # as copied from the live file. A backup is one self-contained file, as PRAGMA journal_mode=DELETE leaves it.
    image[18:20] = b"\x01\x01"
    return bytes(image)


def write_new_file(data: bytes, target: Path, *, force: bool) -> None:
    """`data` as the file `target`, written through one descriptor and named through it (never reopened by
    name); an existing `target` is replaced only with `force`."""
    fd, name = _new_file(target)
    try:
        _write(fd, data)
        os.fsync(fd)
        _place(fd, name, target, force)
        _fsync(target.parent)
    finally:
        os.close(fd)
        if name is not None:
            name.unlink(missing_ok=True)  # only a name: what it holds now is never opened


def _new_file(target: Path) -> tuple[int, Path | None]:
    """A new file beside `target`, held by its descriptor: nameless (O_TMPFILE) where the filesystem can,
    else under a fresh hidden name that O_EXCL makes (no symlink followed). Returns (fd, the name or None)."""
    directory = target.parent
    try:
        try:
            return os.open(directory, os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, 0o600), None
        except OSError as error:
            if error.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
                raise
        name = directory / f".{target.name}.{os.urandom(6).hex()}.partial"
        return os.open(name, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600), name
    except OSError as error:
        raise BadInput(f"can't write {directory} ({error.strerror}); pick a directory you can write") from None


def _write(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _place(fd: int, name: Path | None, target: Path, force: bool) -> None:
    """Give the file `fd` holds the name `target`, through the descriptor: a temporary name, which the
    directory's owner may have swapped meanwhile, is only ever renamed, and what arrived is checked."""
    exists = BadInput(f"{target} already exists; pick another name, or pass --force to replace it")
    if not force:
        try:
            _link(fd, target)  # fails if the target appeared meanwhile: never clobber
        except FileExistsError:
            raise exists from None
        except OSError:  # a filesystem without hard links: a named temporary is renamed instead
            if name is None:
                raise
            if target.exists():
                raise exists from None
            os.rename(name, target)
    else:
        if name is None:  # an atomic replace needs a name to rename from
            name = target.with_name(f".{target.name}.{os.urandom(6).hex()}.partial")
            _link(fd, name)
        os.replace(name, target)
    placed, written = os.lstat(target), os.fstat(fd)
    if (placed.st_dev, placed.st_ino) != (written.st_dev, written.st_ino):
        raise BoardError(f"{target} was replaced while the backup was placed there (its directory is someone"
                         " else's to change); back up into a directory only you can write")


def _link(fd: int, path: Path) -> None:
    """linkat(/proc/self/fd, "N", AT_FDCWD, path, AT_SYMLINK_FOLLOW): a name for the very file the descriptor
    holds. (Without a directory descriptor os.link calls link(2), which does not follow /proc's link.)"""
    proc = os.open("/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.link(str(fd), path, src_dir_fd=proc, follow_symlinks=True)
    finally:
        os.close(proc)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
