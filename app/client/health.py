"""`board doctor`'s view of the service: its socket's type, mode and group, and whether it answers."""

from __future__ import annotations

import grp
import os
import stat
from typing import Iterator

from app.client.socket import SocketClient
from app.errors import BoardError


def service_checks(config) -> Iterator[tuple[bool, str]]:
    """(ok, line) pairs, as app.store.setup.doctor yields them; nothing when no socket is configured."""
    path = config.service.socket
    if not path:
        return
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        yield False, f"no socket at {path}: the board service is not running (systemctl status board-agent)"
        return
    if not stat.S_ISSOCK(info.st_mode):
        yield False, f"{path} is not a socket; stop the service, remove it, and start the service again"
        return
    mode = stat.S_IMODE(info.st_mode)
    yield mode == 0o660, f"socket {path} mode {mode:o}" + ("" if mode == 0o660 else
                                                          " (want 660: restart the service, which recreates it)")
    try:
        group = grp.getgrgid(info.st_gid).gr_name
    except KeyError:
        group = str(info.st_gid)
    wanted = config.service.group
    yield group == wanted, f"socket group {group}" + ("" if group == wanted else
                                                       f" (want {wanted}: restart the service, which recreates it)")
    client = SocketClient(path, timeout=5.0)
    try:
        me = client.call("whoami")
        stats = client.call("stats")
    except BoardError as error:
        yield False, f"the service does not answer: {error}"
        return
    finally:
        client.close()
    yield True, (f"the service answers: you are {me['user']}{' (admin)' if me['admin'] else ''};"
                 f" {stats['subscribers']} board(s) subscribed, {stats['registered']} process(es) registered")
