"""The operations' table: one entry each (name, arguments, handler, whether it writes), and how an entry checks
its arguments.

The modules of this package register into OPS with `@op(...)`; this module imports none of them
(app.service.ops lists them), except the one `lookup` needs for the operation asked for. A handler gets
the Service, the caller's Identity and the checked arguments, and returns JSON.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from app.errors import BadInput

INT, STR, BOOL, LIST, DICT = int, str, bool, list, dict


@dataclass(frozen=True)
class Whole:
    """An integer argument in [low, high]: times and spans stay where dates, the rules and SQLite can take them."""
    low: int
    high: int
    what: str
    __name__ = "int"


# Python's dates end with the year 9999: a time up to 9000, plus a span (extend) or the rules' reach, stays a date.
TIME = Whole(0, 221845392000, "a time from 1970 to 9000 (epoch seconds)")  # 9000-01-01 UTC
SPAN = Whole(-28401840000, 28401840000, "a span of at most 900 years (seconds)")


@dataclass(frozen=True)
class Op:
    name: str
    handler: Callable[..., Any]
    required: dict[str, type]
    optional: dict[str, type]
    writes: bool = False  # changes bookings: subscribers reload them
    frees: bool = False  # may free time, so queued bookings move up after it (Service.backfill)

    def check(self, args: Any) -> dict[str, Any]:
        """The arguments as keywords; a missing, unknown or mistyped one is BadInput (exit 2)."""
        if args is None:
            args = {}
        if not isinstance(args, dict):
            raise BadInput(f"{self.name}: the arguments must be a JSON object")
        for name in self.required:
            if args.get(name) is None:
                raise BadInput(f"{self.name}: missing argument {name!r}")
        known = {**self.required, **self.optional}
        for name, value in args.items():
            if name not in known:
                raise BadInput(f"{self.name}: unknown argument {str(name)[:40]!r}")
            kind = known[name]
            whole = kind is INT or isinstance(kind, Whole)
            if value is not None and (not isinstance(value, int if whole else kind) or (whole and isinstance(value, bool))):
                raise BadInput(f"{self.name}: argument {name!r} must be {kind.__name__}")
            if kind is INT and value is not None and not -(2**63) < value < 2**63:
                raise BadInput(f"{self.name}: argument {name!r} is out of range")
            if isinstance(kind, Whole) and value is not None and not kind.low <= value <= kind.high:
                raise BadInput(f"{self.name}: argument {name!r} must be {kind.what}")
        return {k: v for k, v in args.items() if v is not None}


OPS: dict[str, Op] = {}

# Which module of this package registers each operation, so that the service imports only the module of the one it
# runs (start-up: `board status` in file mode loads no servers, keys or faults). A test checks this against OPS.
HOMES: dict[str, str] = {name: module for module, names in {
    "reads": "whoami stats fleet history report status get list window all_bookings log",
    "bookings": "plan next_free earliest slots book cancel release extend reassign move run",
    "series": "series_book series_get series_extend series_cancel",
    "servers": "serve_start serve_get serve_list serve_logs serve_stop serve_key serve_plan serve_plans"
               " serve_plan_cancel",
    "notify": "notify_test notify_status",
    "faults": "faults",
    "alerts": "alerts",
    "gateway": "key_new key_list key_revoke gateway_state gateway_usage usage",
    "power": "power power_step",
}.items() for name in names.split()}


def lookup(name: object) -> Op | None:
    """The operation called `name`, its module imported on first use; None for a name no module registers."""
    home = HOMES.get(name) if isinstance(name, str) else None
    if home is None:
        return None
    if name not in OPS:
        from importlib import import_module

        import_module(f"app.service.ops.{home}")
    return OPS[name]


def op(name: str, required: dict[str, type] | None = None, optional: dict[str, type] | None = None, writes=False,
       frees=False):
    def register(handler):
        OPS[name] = Op(name, handler, required or {}, optional or {}, writes or frees, frees)
        return handler

    return register


def card_list(value: list | None) -> list[int] | None:
    """A LIST argument that names cards: card numbers only."""
    if value is None:
        return None
    if not all(isinstance(c, int) and not isinstance(c, bool) for c in value):
        raise BadInput("cards must be a list of card numbers")
    return value
