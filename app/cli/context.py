"""The command context (`ctx`), and running one command: a BoardError becomes one line and its exit code.

Both front doors use these: app.quick (no argparse, for speed) and app.cli's full parser. A command
reaches the service only through `ctx.client` and prints through app.output or its own module in app.cli.
"""

from __future__ import annotations

import os
import sys
from datetime import datetime
from functools import cached_property

from app.errors import BadInput, BoardError
from app.output import EXIT_BAD_INPUT, EXIT_OK, EXIT_UNEXPECTED


class Context:
    """What a command needs, each piece opened only when first used: its arguments, the config, the client."""

    def __init__(self, args, environ=os.environ, client=None):
        self.args, self.environ = args, environ
        if client is not None:
            self.client = client

    @cached_property
    def demo(self) -> bool | str | None:
        """A scenario path, True for the default simulated fleet, or None to let BOARD_SIMULATE decide."""
        return getattr(self.args, "scenario", None) or getattr(self.args, "demo", False) or None

    @cached_property
    def config(self):
        from app.config import ConfigError, load_config

        db = getattr(self.args, "db", None)
        if db is None and self.demo is not None and not self.environ.get("BOARD_DB"):
            from app.demo import demo_db_path

            db = demo_db_path(self.environ)
        try:
            config = load_config(db, self.environ)
        except ConfigError as error:
            raise BadInput(str(error)) from None
        if self.demo is not None:  # the demo's pools, so its board shows the rules its service keeps
            from app.demo import demo_config

            config = demo_config(config)
        return config

    @cached_property
    def client(self):
        """The one door to the service: its socket where the config names one, else the service in this process."""
        from app.client import open_client

        explicit_db = getattr(self.args, "db", None) is not None or bool(self.environ.get("BOARD_DB"))
        return open_client(self.config, demo=self.demo, explicit_db=explicit_db, environ=self.environ)

    @cached_property
    def me(self):
        """This process's own identity (file mode only: through the socket, the service says who we are)."""
        from app.core.identity import current_identity

        return current_identity(self.config.admin_group)

    @cached_property
    def conn(self):
        """A connection to a database file this user owns (`board agent` in file mode)."""
        from app.store.db import connect

        return connect(self.config.store)

    @cached_property
    def here(self) -> str:
        """This host's name in the fleet, which a booking on another host's cards is named beside: read without
        app.config, which through the socket costs more than the request (a loaded config answers for itself)."""
        if "config" in vars(self):
            return self.config.fleet_host
        from app.config_file import ConfigError, configured_host

        try:
            return configured_host(self.environ)
        except ConfigError as error:
            raise BadInput(str(error)) from None

    def now(self) -> datetime:
        return datetime.now().astimezone()

    def night_start(self) -> int:
        """What `tonight` means, in minutes after midnight: read from the config only when someone says it."""
        return self.config.booking.night_start_minute


def check_arguments(argv) -> int | None:
    """Bytes that are not UTF-8 arrive as lone surrogates, which SQLite cannot store: one line and exit 2."""
    for arg in argv:
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            print(f"board: the argument {arg[:60]!r} is not valid UTF-8; check the terminal's encoding (LANG)",
                  file=sys.stderr)
            return EXIT_BAD_INPUT
    return None


def run_command(handler, ctx: Context) -> int:
    """Run one command: a BoardError is one inert line on stderr and its exit code, never a traceback."""
    try:
        return handler(ctx)
    except BoardError as error:
        from app.core.text import inert  # messages can quote other users' text: one inert line

        print(f"board: {inert(str(error))}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_OK
    except Exception as error:  # noqa: BLE001 - the last line of defence: no tracebacks for users
        if os.environ.get("BOARD_DEBUG"):
            raise
        from app.core.text import inert

        print(f"board: unexpected error: {type(error).__name__}: {inert(str(error), 300)};"
              " rerun with BOARD_DEBUG=1 for details", file=sys.stderr)
        return EXIT_UNEXPECTED
