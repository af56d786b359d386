"""The operations' handlers, one module per area; what each operation is, and which module registers it, is the
table app.operations.OPERATIONS.

The CLI's commands and the TUI's actions map onto these names, so a feature is added once. How a module registers
its handlers and request types, and how a request is checked, is app.service.ops.registry, which imports none of
the modules below. Importing this package imports none of them (start-up: the service looks up one operation with
registry.lookup, which imports only its module); asking it for OPS, Op or REGISTERS imports them all, so OPS is
then every registered operation.
"""

from __future__ import annotations

from importlib import import_module

from app.operations import OPERATIONS

__all__ = ["OPS", "Op", "REGISTERS"]


def __getattr__(name: str):
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # the modules that fill OPS, in the order the table first names them
    registers = tuple(import_module(f"{__name__}.{module}") for module in dict.fromkeys(
        entry.home for entry in OPERATIONS.values()))
    from app.service.ops.registry import OPS, Op

    return {"OPS": OPS, "Op": Op, "REGISTERS": registers}[name]
