"""The socket client against a scripted door: the windows the real service opens only now and then, held open.

The real service's door (app/service/door/server.py `_refuse`) says why in one line and then closes without reading.
Between that line and the close, a client may already have sent its next request; these tests hold that window.
"""

from __future__ import annotations

import socket
import threading

import pytest

from app.client.socket import SocketClient
from app.errors import NotPermitted
from app.service.door.server import _answer

REFUSAL = _answer(None, error=NotPermitted("no access to the board: ask an admin"))  # the door's own line
WAIT_S = 5.0


class HeldDoor:
    """Refuses each connection in one line, then keeps them all open, unread, until `connections` have come
    (or WAIT_S passed): the real door's send-then-close with the close put off."""

    def __init__(self, path: str, connections: int) -> None:
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen()
        self.listener.settimeout(WAIT_S)
        self.came = 0
        self.thread = threading.Thread(target=self._serve, args=(connections,), daemon=True)
        self.thread.start()

    def _serve(self, connections: int) -> None:
        held = []
        try:
            while self.came < connections:
                conn, _ = self.listener.accept()
                self.came += 1
                conn.sendall(REFUSAL)
                held.append(conn)
        except TimeoutError:
            pass
        finally:
            for conn in held:
                conn.close()
            self.listener.close()


@pytest.mark.parametrize("op", ["whoami", "book"])
def test_after_a_refusal_at_the_door_the_next_request_goes_on_a_new_connection(tmp_path, op):
    door = HeldDoor(str(tmp_path / "board.sock"), connections=2)
    client = SocketClient(str(tmp_path / "board.sock"), timeout=10)
    try:
        with pytest.raises(NotPermitted, match="no access to the board"):
            client.call("whoami")
        # Sent on the first line, still open, this request would go unread, and a write would end as "the service
        # stopped while answering" when the door closed it.
        with pytest.raises(NotPermitted, match="no access to the board"):
            client.call(op)
    finally:
        client.close()
        door.thread.join(timeout=10)
    assert door.came == 2
