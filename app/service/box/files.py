"""The service's own files: its directory 0700 and the database 0600, owned by the service, never through a link.

Checked at start, before SQLite opens anything: a symlink, or a file that belongs to someone
else, stops the service with one line; loose modes are tightened through descriptors opened
with O_NOFOLLOW (fchmod), never by path.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from app.errors import BoardError

SIDE_FILES = ("", "-wal", "-shm", "-journal")


def secure_state(db_path: Path) -> list[str]:
    """Make the database's directory and files the service's alone; returns what it changed."""
    changed = []
    directory = db_path.parent
    uid = os.geteuid()
    try:
        info = os.lstat(directory)
    except FileNotFoundError:
        raise BoardError(f"the service's directory {directory} does not exist; create it owned by the service"
                         " user, mode 0700 (systemd StateDirectory=board does)") from None
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise BoardError(f"{directory} is not a plain directory (a symlink?); the service will not follow it")
    if info.st_uid != uid:
        raise BoardError(f"{directory} belongs to uid {info.st_uid}, not to the service (uid {uid}); chown it")
    if stat.S_IMODE(info.st_mode) != 0o700:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            os.fchmod(fd, 0o700)
        finally:
            os.close(fd)
        changed.append(f"{directory}: mode {stat.S_IMODE(info.st_mode):o} -> 700")
    for suffix in SIDE_FILES:
        path = Path(f"{db_path}{suffix}")
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(info.st_mode):
            raise BoardError(f"{path} is not a plain file (a symlink?); remove it, the service will not follow it")
        if info.st_uid != uid or info.st_nlink != 1:
            raise BoardError(f"{path} belongs to uid {info.st_uid} or has other names (links: {info.st_nlink});"
                             " it is not the service's own file")
        if stat.S_IMODE(info.st_mode) & 0o077:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            try:
                os.fchmod(fd, 0o600)
            finally:
                os.close(fd)
            changed.append(f"{path}: mode {stat.S_IMODE(info.st_mode):o} -> 600")
    return changed
