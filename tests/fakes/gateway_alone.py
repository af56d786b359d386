"""`board gateway`'s serving code alone, for tests that need it as its own process (its own open-file limit, its
own /proc/PID/fd): the service's socket replaced by one fixed gateway_state (tests/unit/test_gateway_relay.py's
FixedState: server 7, alias `m`, at UPSTREAM; the key bk-client-key of bob).

    python -m tests.fakes.gateway_alone UPSTREAM_URL LISTEN

It raises its open-file limit as run_gateway does, and serves until SIGTERM."""

from __future__ import annotations

import asyncio
import sys

from app.config import Config, GatewaySettings
from app.gateway.server import Gateway, serve
from app.service.door.server import raise_file_limit
from tests.unit.test_gateway_relay import FixedState


def main(upstream: str, listen: str) -> None:
    raise_file_limit()
    asyncio.run(serve(Gateway(Config(gateway=GatewaySettings()), FixedState(upstream, parallel=16)), listen))


if __name__ == "__main__":
    main(*sys.argv[1:3])
