"""The one client interface: what the CLI and the TUI may ask of the service, whichever transport they hold."""

from __future__ import annotations

from typing import Any, Iterator, Protocol


class Client(Protocol):
    transport: str  # "local" or "socket"

    def call(self, op: str, **args: Any) -> Any:
        """Run one operation; raises the BoardError (with its exit code) the service raised."""
        ...

    def subscribe(self, kinds: tuple[str, ...]) -> Iterator[dict[str, Any]]:
        """Events as they happen ({"event": "bookings", "version": 3}, ...), until close()."""
        ...

    def close(self) -> None: ...
