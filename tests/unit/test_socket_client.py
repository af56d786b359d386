"""The socket client against a scripted door: the windows the real service opens only now and then, held open.

The real service's door (app/service/door/server.py `_refuse`) says why in one line and then closes without reading.
Between that line and the close, a client may already have sent its next request; these tests hold that window.
"""

from __future__ import annotations

import socket
import threading

import pytest

from app import wire
from app.client.socket import SocketClient
from app.errors import NotPermitted, ServiceDown
from app.operations import OPERATIONS
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


class DiesWhileAnswering:
    """A service that reads the first request and dies before it answers (the line closes), then, restarted,
    answers every request on the next connection: the window a restart opens in the middle of a call."""

    def __init__(self, path: str) -> None:
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen()
        self.listener.settimeout(WAIT_S)
        self.requests: list[dict] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            first, _ = self.listener.accept()
            with first, first.makefile("rb") as reader:
                self.requests.append(wire.decode(reader.readline()))
            second, _ = self.listener.accept()
            with second, second.makefile("rb") as reader:
                while line := reader.readline():
                    self.requests.append(request := wire.decode(line))
                    second.sendall(wire.encode({"id": request["id"], "ok": True, "result": {"answered": True}}))
        except TimeoutError:
            pass
        finally:
            self.listener.close()


@pytest.mark.parametrize("op", ["history", "slots", "serve_list", "whoami", "book", "cancel", "key_new"])
def test_only_what_changes_nothing_is_sent_again_after_the_service_died_while_answering(tmp_path, op):
    """The table's `resend_safe` decides (app.operations): a read is sent again on a new connection and answered; a
    change may have landed before the service died, so it is not sent twice. Wrong versions: the old hand-kept
    READS (history, slots and serve_list were not in it, and failed); every request resent (a booking made twice)."""
    service = DiesWhileAnswering(str(tmp_path / "board.sock"))
    client = SocketClient(str(tmp_path / "board.sock"), timeout=10)
    try:
        if OPERATIONS[op].resend_safe:
            assert client.call(op) == {"answered": True}
            assert [r["op"] for r in service.requests] == [op, op]
        else:
            with pytest.raises(ServiceDown, match=rf"stopped while answering \({op}\)"):
                client.call(op)
            assert [r["op"] for r in service.requests] == [op]
    finally:
        client.close()
        with socket.socket(socket.AF_UNIX) as poke:  # lets an accept still waiting for a resend go
            poke.connect_ex(str(tmp_path / "board.sock"))
        service.thread.join(timeout=10)
    assert OPERATIONS[op].resend_safe == (op in {"history", "slots", "serve_list", "whoami"})


def test_the_reader_gives_lines_as_a_buffered_file_does_across_any_split():
    """app.client.socket.Lines reads recv's chunks into lines as socket.makefile("rb") does (the file it replaced):
    a line split across chunks, two lines in one chunk, a line over the limit cut at the limit (the caller refuses
    it), the last bytes without a newline, then b"" for good; iterated, the same lines. Nearest wrong versions: a
    newline at the limit's edge counted as inside it, the search resumed past a newline already in the buffer, the
    tail dropped at EOF."""
    from app.client.socket import Lines

    sent = [b'{"a"', b':1}\n{"b":2}\n{"c"', b":3}\n", b"x" * 9 + b"\n", b"0123456789\n", b"tail"]

    def read(make, limit: int | None) -> list[bytes]:
        ours, theirs = socket.socketpair()
        with ours, theirs:
            for chunk in sent:
                theirs.sendall(chunk)
            theirs.shutdown(socket.SHUT_WR)
            reader = make(ours)
            if limit is None:
                return list(reader)
            return [reader.readline(limit) for _ in range(10)]

    for limit in (10, 11, None):
        expected = read(lambda sock: sock.makefile("rb"), limit)
        assert read(Lines, limit) == expected
    assert b"0123456789" in read(Lines, 10) and b"tail" in read(Lines, None)  # the cases above are there
