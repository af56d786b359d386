"""The operations: one table (OPS), one entry each: its name, arguments, handler, and whether it writes.

The CLI's commands and the TUI's actions map onto these names, so a feature is added once. The table and
how an entry checks its arguments are app.service.ops.registry, which imports none of the modules below;
each of them registers one area's operations with `@op`. Importing this package imports none of them
(start-up: the service looks up one operation with registry.lookup, which imports only its module);
asking it for OPS, Op or REGISTERS imports them all, so OPS is then the whole table.
"""

from __future__ import annotations

from importlib import import_module

from app.service.ops.registry import HOMES

__all__ = ["OPS", "Op", "REGISTERS"]


def __getattr__(name: str):
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # the modules that fill OPS, in the order they are listed in registry.HOMES
    registers = tuple(import_module(f"{__name__}.{module}") for module in dict.fromkeys(HOMES.values()))
    from app.service.ops.registry import OPS, Op

    return {"OPS": OPS, "Op": Op, "REGISTERS": registers}[name]
