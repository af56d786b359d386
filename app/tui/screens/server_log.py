"""The Servers screen's log view: the highlighted server's log, followed live.

Following lives once, in app.llama.logs.follow: for your own server it reads the file your own
supervisor writes (as `board serve logs -f` does). For a planned one, or an admin reading someone else's, it
shows the lines the service holds (`serve_logs`, sent to it by that server's supervisor), read again every second.
A member does not see another member's log.
"""

from __future__ import annotations

import os
import threading

from rich.cells import cell_len
from textual.widgets import Log

from app.core.identity import Identity
from app.core.text import inert
from app.llama.rows import Server

LOG_LINES = 200


class ServerLog(Log):
    def __init__(self, **kwargs) -> None:
        super().__init__(max_lines=5000, auto_scroll=True, **kwargs)
        self._following: int | None = None
        self._stop: threading.Event | None = None

    def on_unmount(self) -> None:
        if self._stop is not None:
            self._stop.set()

    # Log's is a thread worker (@work types it as returning a Worker); this one runs in place on purpose, and Log
    # ignores what it returns.
    def _update_size(self, updates: int, lines: list[str]) -> None:  # type: ignore[override]
        """The width of new lines, measured here rather than in Log's thread worker: that worker calls back into
        the app, and when the board quits while a line arrives it finds no app and fails the exit (WorkerFailed).
        A followed log brings a few lines at a time, so measuring them in place costs nothing."""
        if lines:
            self._update_maximum_width(updates, max(cell_len(self._process_line(line)) for line in lines))

    def follow(self, server: Server | None, client, me: Identity) -> None:
        """Show `server`'s log from now on (nothing for None); a no-op while it already does. Another member's log
        is theirs and admins' (it may hold the prompts the gateway relayed): it is not asked for."""
        wanted = server.id if server else None
        if wanted == self._following:
            return
        self._following = wanted
        if self._stop is not None:
            self._stop.set()
        self.clear()
        if server is None or client is None:
            return
        if server.uid != me.uid and not me.is_admin:
            self.write_line(inert(f"server {server.id} is {server.user}'s: only they or an admin can read its log", 200))
            return
        stop = self._stop = threading.Event()
        own = server.uid == os.getuid() and server.log_path and os.access(server.log_path, os.R_OK)
        target = self._file if own else self._service
        threading.Thread(target=target, args=(server, client, stop), name="board-log", daemon=True).start()

    def _emit(self, lines: list[str], stop: threading.Event) -> bool:
        if stop.is_set():
            return False
        try:
            self.app.call_from_thread(self.write_lines, [inert(line.replace("\t", "    ")) for line in lines])
        except RuntimeError:  # the app has gone
            return False
        return True

    def _file(self, server: Server, client, stop: threading.Event) -> None:
        from app.llama.logs import follow

        for line in follow(server.log_path, start_lines=LOG_LINES, until=stop.is_set, poll_s=0.25):
            if not self._emit([line], stop):
                return

    def _service(self, server: Server, client, stop: threading.Event) -> None:
        from app.errors import BoardError

        from app.tui.pollers import own_client

        mine = own_client(client)
        seen: list[str] = []
        try:
            while not stop.is_set():
                try:
                    found = mine.call("serve_logs", id=server.id, lines=LOG_LINES)
                except BoardError:
                    return
                lines = found["lines"]
                if not self._emit(_new_lines(seen, lines), stop):
                    return
                seen = lines
                if not found["live"]:
                    return
                stop.wait(1.0)
        finally:
            if mine is not client:
                mine.close()


def _new_lines(before: list[str], after: list[str]) -> list[str]:
    for overlap in range(min(len(before), len(after)), 0, -1):
        if before[-overlap:] == after[:overlap]:
            return after[overlap:]
    return after
