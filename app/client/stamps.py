"""The service's time stamps, worded for the person here: both clients word what the service says at their door,
in this process's zone, the reader's (app.core.text.localize). The service writes stamps, not times, so that one
service serves readers in many zones."""

from __future__ import annotations

from app import wire


def worded(text: str) -> str:
    """`text` (a reply, a message) with the service's time stamps worded in this process's zone. Only a text with a
    stamp pays for the import."""
    if "<@" not in text:
        return text
    from app.core.text import localize  # start-up: the socket client's quick path loads no re

    return localize(text)


def receive(line: bytes) -> dict:
    """A message from the service, for a person here: `wire.decode`, its stamps `worded`."""
    return wire.decode(worded(line.decode()) if b"<@" in line else line)
