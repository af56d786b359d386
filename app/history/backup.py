"""`board backup PATH` also copies the history (board.history.db) to PATH's history name, PATH with `.history.db`.

The history is a file of its own (app.history.store says why), so app.store.backup's copy, which opens and checks
a board database, is not for it. This copy takes one read snapshot of the live history with SQLite's backup API
into memory, checks it (integrity_check), and writes it as app.store.backup writes the board's copy: through one descriptor,
never reopened by name, so a member who may write that directory cannot swap the copy for a link of theirs. An
existing copy is replaced only with --force.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path

from app.errors import BadInput, BoardError
from app.store.backup import refuse_live_files, file_image, snapshot, write_new_file
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
    refuse_live_files(source, target)
    if target.is_dir():
        raise BadInput(f"{target} is a directory; the history's copy needs that name free")
    if (target.exists() or target.is_symlink()) and not force:
        raise BadInput(f"{target} already exists (the history's copy beside the backup); pick another name,"
                       " or pass --force to replace both")
    for suffix in ("-wal", "-shm", "-journal"):
        if Path(f"{target}{suffix}").exists():
            raise BadInput(f"{target}{suffix} exists (a database was in use there); remove it or pick another name")


def backup_history(source: Path, target: Path, *, force: bool = False) -> HistoryBackup | None:
    """Copy the live history at `source` to `target`; None when there is no history (the service never sampled)."""
    source, target = Path(source), Path(target)
    if not source.is_file():
        return None
    check_history_target(source, target, force=force)
    _refuse_planted_links(source)
    try:
        src = sqlite3.connect(source, isolation_level=None)
        try:
            with snapshot(src) as copy:
                integrity = "; ".join(row[0] for row in copy.execute("PRAGMA integrity_check").fetchall())
                data = file_image(copy)
        finally:
            src.close()
    except sqlite3.Error as error:
        raise BoardError(f"can't read the history {source} ({error}); board doctor says more") from None
    if integrity != "ok":
        raise BoardError(f"the history {source} fails integrity_check ({integrity}); nothing was written for it")
    write_new_file(data, target, force=force)
    return HistoryBackup(target, len(data), integrity)
