"""`board backup` never writes over the live database's own -wal, -shm or -journal, however the target is spelled.

Replacing the live write-ahead log with a copy of the database would make SQLite discard or
misread the newest commits. Each refusal is exit 2, one line, and leaves the directory as it was.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from app.errors import BadInput
from app.store.backup import backup
from app.store.db import connect, write
from tests.conftest import run_board


@pytest.fixture
def live(tmp_path):
    """A database held open (so its -wal and -shm exist) with one committed row; yields its path."""
    db = tmp_path / "live" / "board.db"
    db.parent.mkdir()
    conn = connect(db)
    with write(conn):
        conn.execute("INSERT INTO cards (uuid, idx, seen_at) VALUES ('GPU-a', 0, 0)")
    yield db
    conn.close()


def listing(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if not p.name.endswith("-shm")}


SPELLINGS = {
    "plain": lambda db, s, tmp: Path(f"{db}{s}"),
    "dot": lambda db, s, tmp: db.parent / "." / f"{db.name}{s}",
    "dotdot": lambda db, s, tmp: db.parent / ".." / db.parent.name / f"{db.name}{s}",
    "double-slash": lambda db, s, tmp: Path(f"{db.parent}//{db.name}{s}"),
    "symlink-to-file": lambda db, s, tmp: _link(tmp / "innocent.db", Path(f"{db}{s}")),
    "symlinked-dir": lambda db, s, tmp: _link(tmp / "alias", db.parent) / f"{db.name}{s}",
}


def _link(link: Path, target: Path) -> Path:
    os.symlink(target, link)
    return link


@pytest.mark.parametrize("spelling", SPELLINGS)
@pytest.mark.parametrize("suffix", ["-wal", "-shm", "-journal"])
@pytest.mark.parametrize("force", [False, True])
def test_the_live_files_are_refused(live, tmp_path, suffix, spelling, force):
    target = SPELLINGS[spelling](live, suffix, tmp_path)
    before = listing(live.parent)
    with pytest.raises(BadInput) as caught:
        backup(live, target, force=force)
    message = str(caught.value)
    assert caught.value.exit_code == 2 and "\n" not in message
    assert f"own {suffix[1:]} file" in message, message
    assert listing(live.parent) == before
    assert not [p for p in tmp_path.rglob("*.partial")]


def test_the_live_database_itself_by_another_spelling_is_refused(live, tmp_path):
    for target in (live.parent / "." / live.name, _link(tmp_path / "same.db", live)):
        with pytest.raises(BadInput, match="live database itself"):
            backup(live, target, force=True)


def test_a_name_that_only_looks_alike_is_fine(live, tmp_path):
    result = backup(live, tmp_path / "board.db-wal.bak")
    assert result.integrity == "ok"


def test_the_cli_refuses_in_one_line(live):
    wal = Path(f"{live}-wal")
    before = wal.read_bytes()
    result = run_board("backup", str(wal), "--force", env={"BOARD_DB": str(live), "BOARD_SIMULATE": "1"})
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.splitlines()) == 1 and "Traceback" not in result.stderr
    assert wal.read_bytes() == before
