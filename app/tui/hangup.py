"""A board whose terminal goes away ends.

Closing the terminal hangs up its tty. Only the session leader is sure to get SIGHUP: under
`make run` or `su -c` that is make or su, which wait for the board, and the board never hears
of it. Textual's input thread then reads EOF from the dead tty in a loop (100 % of a core)
and its output thread dies on EIO, so nothing ends the app.

`ending_on_hangup` therefore watches for the end itself: a thread blocks in poll() on the
terminal, which reports POLLHUP when it is hung up, and SIGHUP or SIGTERM wake that thread
through a pipe. It asks the app to exit, and since a shutdown that writes to a dead terminal
can block (the output queue fills once its thread has died), a timer ends the process with
os._exit after GRACE_SECONDS whatever happens, first putting back a terminal that is still
there (SIGTERM). The pollers are daemon threads; nothing is lost.
"""

from __future__ import annotations

import os
import select
import signal
import termios
import threading
from contextlib import contextmanager
from typing import Callable, Iterator

GRACE_SECONDS = 1.0
EXIT_HANGUP = 128 + signal.SIGHUP  # the shell's convention for "ended by this signal"
EXIT_TERMINATED = 128 + signal.SIGTERM
GONE = select.POLLHUP | select.POLLERR | select.POLLNVAL
# What Textual's stop_application_mode writes: keyboard protocol, alt screen, cursor, focus, mouse, paste, wrap.
RESET = b"\x1b[<u\x1b[?1049l\x1b[?25h\x1b[?1004l\x1b[?1000l\x1b[?1003l\x1b[?1015l\x1b[?1006l\x1b[?2004l\x1b[?7h"


def hung_up(fd: int) -> bool:
    """True when `fd` (the terminal) is hung up or closed; never reads from it."""
    poller = select.poll()
    poller.register(fd, 0)  # no events asked for: POLLHUP, POLLERR and POLLNVAL always come
    return any(mask & GONE for _, mask in poller.poll(0))


@contextmanager
def ending_on_hangup(end: Callable[[int], None], fd: int = 0) -> Iterator[None]:
    """While inside, a hung-up terminal `fd`, SIGHUP or SIGTERM calls `end(exit code)` once, from a
    thread, then ends the process after GRACE_SECONDS if it is still there. Enter from the main thread."""
    try:
        modes = termios.tcgetattr(fd)  # before Textual's raw mode, for the fallback to put back
    except termios.error:
        modes = None
    wake_read, wake_write = os.pipe()
    ending = threading.Event()
    finished = threading.Event()
    fired = threading.Event()

    def on_signal(signum: int, _frame) -> None:
        if signum == signal.SIGTERM:
            ending.set()  # a kill from elsewhere: the terminal is still there to be restored
        os.write(wake_write, b"!")

    def watch() -> None:
        poller = select.poll()
        poller.register(fd, 0)
        poller.register(wake_read, select.POLLIN)
        poller.poll()
        if finished.is_set():
            return
        fired.set()
        code = EXIT_TERMINATED if ending.is_set() else EXIT_HANGUP
        if hung_up(fd):
            _silence()
        fallback = threading.Timer(GRACE_SECONDS, _give_up, (code, fd, modes))
        fallback.daemon = True  # ends the process even if the interpreter's shutdown hangs
        fallback.start()
        try:
            end(code)
        except Exception:  # noqa: BLE001 - the app is not running (yet, or any more): the fallback ends it
            pass

    previous = {signum: signal.signal(signum, on_signal) for signum in (signal.SIGHUP, signal.SIGTERM)}
    watcher = threading.Thread(target=watch, name="board-hangup", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        finished.set()
        os.write(wake_write, b"!")
        if not fired.is_set():  # once fired, it may wait on the app for good: leave it to the fallback
            watcher.join(1.0)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        os.close(wake_read)
        os.close(wake_write)


def _give_up(code: int, fd: int, modes: list | None) -> None:
    """The app did not end in time: leave a terminal that is still there usable (a SIGTERM on a
    loaded machine), then end the process."""
    try:
        if not hung_up(fd):
            if modes is not None:
                termios.tcsetattr(fd, termios.TCSANOW, modes)
            os.write(2, RESET)
    except (OSError, termios.error):
        pass
    os._exit(code)


def _silence() -> None:
    """Point stdin, stdout and stderr at /dev/null: Textual's shutdown writes (and any late
    traceback) then succeed instead of failing with EIO on the dead terminal."""
    null = os.open(os.devnull, os.O_RDWR)
    for target in (0, 1, 2):
        os.dup2(null, target)
    os.close(null)
