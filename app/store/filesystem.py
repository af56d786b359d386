"""Which filesystem holds a path. SQLite's WAL needs shared memory on one host, so network filesystems are refused."""

from __future__ import annotations

import os
from pathlib import Path

MOUNTS = Path("/proc/self/mounts")
NETWORK_TYPES = frozenset({"nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "ceph", "glusterfs", "lustre", "afs"})


def filesystem_type(path: Path, mounts: Path | None = None) -> str | None:
    """The type of the mount that holds `path` (its nearest existing ancestor), or None if unknown."""
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    path = path.resolve()
    try:
        lines = (mounts or MOUNTS).read_text().splitlines()
    except OSError:
        return None
    best, best_type = "", None
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        if _contains(point, path) and len(point) >= len(best):
            best, best_type = point, fields[2]
    return best_type


def network_filesystem(path: Path, mounts: Path | None = None) -> str | None:
    """The network or FUSE filesystem type that holds `path`, or None when it is local."""
    kind = filesystem_type(path, mounts)
    if kind and (kind in NETWORK_TYPES or kind == "fuse" or kind.startswith("fuse.")):
        return kind
    return None


def _contains(point: str, path: Path) -> bool:
    return point == "/" or path == Path(point) or Path(point) in path.parents
