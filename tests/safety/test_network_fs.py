"""A database on a network or FUSE filesystem is refused, in one clear line, by connect and doctor.

SQLite's WAL keeps its index in shared memory (-shm), which only works between processes on one
host. The mounts table is substituted (app.store.filesystem.MOUNTS), so no real NFS is needed.
"""

from __future__ import annotations

import pytest

import app.store.filesystem as filesystem
from app.cli import main
from app.store.db import StoreError, connect
from app.store.setup import doctor

REFUSED = ["nfs", "nfs4", "cifs", "smb3", "smbfs", "fuse.sshfs", "fuse", "fuse.gcsfuse", "fuse.s3fs", "9p", "ceph",
           "glusterfs", "lustre", "afs"]
LOCAL = ["ext4", "xfs", "btrfs", "tmpfs", "overlay", "zfs"]


@pytest.fixture
def mounted(tmp_path, monkeypatch):
    """mounted(kind) -> a directory that the substituted mounts table says is a `kind` mount."""
    table = tmp_path / "mounts"
    lines = ["/dev/sda1 / ext4 rw,relatime 0 0", "proc /proc proc rw 0 0"]

    def mount(kind: str, name: str | None = None):
        point = tmp_path / (name or kind.replace(".", "-"))
        point.mkdir(exist_ok=True)
        source = "server:/export" if not kind.startswith("fuse") else "user@host:"
        lines.append(f"{source} {str(point).replace(' ', chr(92) + '040')} {kind} rw,relatime 0 0")
        table.write_text("\n".join(lines) + "\n")
        return point

    table.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(filesystem, "MOUNTS", table)
    return mount


def one_line_with(text: str, kind: str) -> None:
    assert "\n" not in text.strip()
    assert kind in text and "local" in text, text


@pytest.mark.parametrize("kind", REFUSED)
def test_connect_refuses(mounted, kind):
    db = mounted(kind) / "board.db"
    with pytest.raises(StoreError) as caught:
        connect(db)
    one_line_with(str(caught.value), kind)
    assert not db.exists(), "nothing may be created on the network filesystem"


@pytest.mark.parametrize("kind", ["nfs", "nfs4", "cifs", "smb3", "fuse.sshfs", "fuse"])
def test_doctor_refuses(mounted, kind):
    checks = list(doctor(mounted(kind) / "board.db", "board-admin"))
    assert len(checks) == 1 and checks[0][0] is False
    one_line_with(checks[0][1], kind)


@pytest.mark.parametrize("kind", ["nfs", "nfs4", "cifs", "smb3", "fuse.sshfs", "fuse"])
@pytest.mark.parametrize("command", [["status"], ["book", "1", "--for", "1h"], ["list"], ["doctor"]])
def test_the_cli_says_so_in_one_line(mounted, kind, command, capsys, monkeypatch):
    db = mounted(kind) / "board" / "board.db"
    db.parent.mkdir()
    monkeypatch.setenv("BOARD_DB", str(db))
    monkeypatch.setenv("BOARD_SIMULATE", "1")
    monkeypatch.delenv("BOARD_LLAMA_SERVER", raising=False)  # doctor's build check is another subject (a CPU build)
    code = main(command)
    out, err = capsys.readouterr()
    assert code != 0
    if command == ["doctor"]:
        assert err == ""
        fixes = [line for line in out.splitlines() if line.startswith("FIX")]
        assert len(fixes) == 1
        one_line_with(fixes[0], kind)
    else:
        assert out == ""
        assert len(err.splitlines()) == 1 and err.startswith("board: ")
        one_line_with(err, kind)
        assert "Traceback" not in err
    assert not db.exists()


@pytest.mark.parametrize("kind", LOCAL)
def test_local_filesystems_are_fine(mounted, kind):
    db = mounted(kind) / "board.db"
    connect(db).close()
    assert db.exists()
    assert [ok for ok, _ in doctor(db, "root")][0] is True


def test_the_nearest_mount_wins(mounted, tmp_path):
    outer = mounted("nfs", "shared")
    inner = outer / "local"
    inner.mkdir()
    mounted("ext4", "shared/local")
    connect(inner / "board.db").close()  # a local disk mounted inside an NFS tree is fine
    with pytest.raises(StoreError, match="nfs"):
        connect(outer / "board.db")
    outer_local = mounted("ext4", "home")
    nfs_inside = outer_local / "nfs"
    nfs_inside.mkdir()
    mounted("nfs4", "home/nfs")
    with pytest.raises(StoreError, match="nfs4"):
        connect(nfs_inside / "deeper" / "board.db")  # a path that does not exist yet: its nearest existing parent


def test_a_mount_point_with_spaces(mounted):
    point = mounted("cifs", "team share")
    with pytest.raises(StoreError, match="cifs"):
        connect(point / "board.db")


def test_a_symlink_into_a_network_mount(mounted, tmp_path):
    point = mounted("nfs", "far")
    link = tmp_path / "looks-local"
    link.symlink_to(point)
    with pytest.raises(StoreError, match="nfs"):
        connect(link / "board.db")


def test_the_real_mounts_table_is_read_by_default(tmp_path):
    assert filesystem.MOUNTS.as_posix() == "/proc/self/mounts"
    assert filesystem.filesystem_type(tmp_path) is not None
