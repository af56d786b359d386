"""`board backup PATH`: a consistent copy of the live database, made with SQLite's online backup API.

The copy is taken from one read snapshot: the source connection opens a read transaction first
and holds it for every backup step, so writers carry on (WAL lets them) and the copy is the
database exactly as it was at that instant, never a mix. Without the held snapshot SQLite
restarts a stepwise backup whenever another process commits, which under steady writes may
never finish.

The copy is written to a hidden temporary file beside PATH, switched to a rollback journal (one
self-contained file), checked (integrity_check and the audit chain), synced, and only then
moved into place. An existing PATH is never replaced without force=True.
"""

from __future__ import annotations

import os
import sqlite3
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
    _refuse_live_files(source, target)
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
    temporary = target.with_name(f".{target.name}.{os.getpid()}.partial")
    try:
        try:
            os.close(os.open(temporary, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except OSError as error:
            raise BadInput(f"can't write {target.parent} ({error.strerror}); pick a directory you can write") from None
        try:
            result = _copy(src, temporary, progress, pages_per_step)
            _fsync(temporary)
            _place(temporary, target, force)
            _fsync(target.parent)
        finally:
            for leftover in (temporary, Path(f"{temporary}-journal")):
                leftover.unlink(missing_ok=True)
    finally:
        src.close()
    if result.integrity != "ok":
        raise BoardError(f"copied to {target}, but the copy fails integrity_check ({result.integrity});"
                         " the live database may be damaged: run board doctor")
    return replace(result, path=target)


def _refuse_live_files(source: Path, target: Path) -> None:
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


def _copy(src: sqlite3.Connection, temporary: Path, progress: Progress | None, pages_per_step: int) -> BackupResult:
    dst = sqlite3.connect(temporary, isolation_level=None)
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
        dst.execute("PRAGMA journal_mode = DELETE")  # a backup is one self-contained file
        integrity = "; ".join(row[0] for row in dst.execute("PRAGMA integrity_check").fetchall())
        broken = events.first_broken(dst) if integrity == "ok" else None
        return BackupResult(
            path=temporary,
            pages=dst.execute("PRAGMA page_count").fetchone()[0],
            page_size=dst.execute("PRAGMA page_size").fetchone()[0],
            bookings=dst.execute("SELECT count(*) FROM bookings").fetchone()[0] if integrity == "ok" else 0,
            events=dst.execute("SELECT count(*) FROM events").fetchone()[0] if integrity == "ok" else 0,
            integrity=integrity,
            first_broken_event=broken,
        )
    finally:
        dst.close()


def _place(temporary: Path, target: Path, force: bool) -> None:
    if force:
        os.replace(temporary, target)
        return
    try:
        os.link(temporary, target)  # fails if the target appeared meanwhile: never clobber
    except FileExistsError:
        raise BadInput(f"{target} already exists; pick another name, or pass --force to replace it") from None
    except OSError:  # a filesystem without hard links
        if target.exists():
            raise BadInput(f"{target} already exists; pick another name, or pass --force to replace it") from None
        os.rename(temporary, target)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
