"""The one door the CLI and the TUI use: `call(op, **args)` and `subscribe(kinds)`, over either transport.

- LocalClient runs the service in this process, on a database file the user owns
  (one person, --demo, make run, most tests).
- SocketClient talks to `board agent` over its Unix socket (the shared install).

Neither the CLI nor the TUI knows which one it holds. This module and app.client.socket stay
light: the socket path imports _socket and _thread (app.wire: _json), not sqlite3, the rules or the GPU code.
The interface both clients offer is written down in app.client.interface.
"""

from __future__ import annotations


def open_client(config, *, demo: bool | str | None = None, explicit_db: bool = False, environ=None):
    """The socket client where the config names a socket (and no personal database was asked for), else in-process."""
    socket_path = config.service.socket
    if socket_path and not explicit_db and demo is None:
        from app.client.socket import SocketClient  # start-up: each transport loads only its own modules

        return SocketClient(socket_path)
    from app.client.local import LocalClient  # start-up: the socket path never loads the service

    return LocalClient.open(config, demo=demo, environ=environ)
