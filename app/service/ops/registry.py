"""How an operation registers its handler and its request type, and how a request is checked.

The facts about each operation (its name, home module, flags) are app.operations.OPERATIONS; the modules of this
package register into OPS with `@op(name, Request)`, naming only what that table does not say: the handler and the
type of its request. This module imports none of them, except the one `lookup` needs for the operation asked for.

A request is a `Request` (a frozen msgspec Struct, no unknown fields), declared beside its handler with a typed reply
(a TypedDict where the reply is a JSON object). The service converts the JSON arguments with msgspec.convert
(strict: no "7" for 7, no true for 1), and a ValidationError is BadInput (exit 2) naming the operation and the
field's path. The handler gets the Service, the caller's Identity and the request, and returns the reply.

"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Callable, TypeVar, get_args, get_type_hints

import msgspec

from app.errors import BadInput
from app.operations import OPERATIONS

if TYPE_CHECKING:
    from app.core.identity import Identity

# Python's dates end with the year 9999: a time up to 9000, plus a span (extend) or the rules' reach, stays a date.
TIME_LOW, TIME_HIGH = 0, 221845392000  # 9000-01-01 UTC
SPAN_HIGH = 28401840000  # 900 years

Time = Annotated[int, msgspec.Meta(ge=TIME_LOW, le=TIME_HIGH, description="a time from 1970 to 9000, epoch seconds")]
Span = Annotated[int, msgspec.Meta(ge=-SPAN_HIGH, le=SPAN_HIGH, description="a span of at most 900 years, seconds")]
Int = Annotated[int, msgspec.Meta(ge=-(2**63) + 1, le=2**63 - 1, description="a 64-bit integer, as SQLite holds")]


class Request(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True,
              rename={"klass": "class", "first": "from"}):
    """An operation's arguments. The one place the wire's Python keywords are spelled: a field `klass` is `class`
    on the wire, `first` is `from`. msgspec gives a subclass these settings, but mypy does not: each request says
    `frozen=True` again (mypy refuses a "non-frozen" subclass), and `kw_only=True` where its required fields follow
    a base's defaulted ones."""


class NoArguments(Request, frozen=True):
    """The request of an operation that takes none."""


class ById(Request, frozen=True):
    """The request of an operation on one row: a booking, a series, a server, a key."""
    id: Int


@dataclass(frozen=True)
class Op:
    name: str
    handler: Callable[..., Any]
    request: type[Request]

    @property
    def changes_bookings(self) -> bool:
        return OPERATIONS[self.name].changes_bookings

    @property
    def frees(self) -> bool:
        return OPERATIONS[self.name].frees

    def check(self, args: Any) -> Any:
        """The request; a missing, unknown or mistyped argument is BadInput (exit 2). A null is an argument not
        given, as it always was on this wire."""
        if args is None:
            args = {}
        if not isinstance(args, dict):
            raise BadInput(f"{self.name}: the arguments must be a JSON object")
        try:
            return msgspec.convert({k: v for k, v in args.items() if v is not None}, self.request)
        except msgspec.ValidationError as error:
            raise BadInput(refusal(self.name, self.request, str(error))) from None

    def run(self, service: Any, me: Identity, checked: Any) -> Any:
        """The handler's reply to the checked request."""
        return self.handler(service, me, checked)


_MISSING = re.compile(r"Object missing required field `(.*)`")
_UNKNOWN = re.compile(r"Object contains unknown field `(.*)`", re.DOTALL)


def refusal(name: str, request: type[Request], error: str) -> str:
    """msgspec's ValidationError as one line: `book: missing argument 'end'`, `book: unknown argument 'why'`,
    `book: expected int, got str at $.cards[0]`, with what a bounded argument means."""
    what, _, where = error.partition(" - at `")
    where = where.removesuffix("`")
    if not where and (missing := _MISSING.fullmatch(what)):
        return f"{name}: missing argument {missing[1]!r}"
    if unknown := _UNKNOWN.fullmatch(what):  # at any depth: the name is the sender's, so cut and made inert
        return f"{name}: unknown argument {unknown[1][:40]!r}{f' at {where}' if where else ''}"
    if not where and what.startswith("Expected `object`"):
        return f"{name}: the arguments must be a JSON object"
    line = f"{name}: {what[:1].lower()}{what[1:].replace('`', '')}{f' at {where}' if where else ''}"
    meaning = _meaning(request, where)
    return f"{line} ({meaning})" if meaning else line


def _meaning(request: type[Request], where: str) -> str | None:
    """The description of the argument at `$.name`, where its type carries one (Time, Span)."""
    wire_name = where.removeprefix("$.")
    for info in msgspec.structs.fields(request):
        if info.encode_name == wire_name:
            return _description(get_type_hints(request, include_extras=True)[info.name])
    return None


def _description(hint: Any) -> str | None:
    """The Meta description in a type: Span, or Span | None."""
    for part in get_args(hint):
        if isinstance(part, msgspec.Meta):
            return part.description
        if (found := _description(part)) is not None:
            return found
    return None


OPS: dict[str, Op] = {}


def lookup(name: object) -> Op | None:
    """The operation called `name`, its module imported on first use; None for a name the table does not list."""
    if not isinstance(name, str) or (found := OPERATIONS.get(name)) is None:
        return None
    if name not in OPS:
        from importlib import import_module

        import_module(f"app.service.ops.{found.home}")
    return OPS[name]


R = TypeVar("R", bound=Request)


def op(name: str, request: type[R]) -> Callable[[Callable[[Any, Identity, R], Any]], Callable[[Any, Identity, R], Any]]:
    """Register the handler of operation `name` (its facts are app.operations.OPERATIONS[name]) with the type of its
    request."""
    def register(handler: Callable[[Any, Identity, R], Any]) -> Callable[[Any, Identity, R], Any]:
        OPS[name] = Op(name, handler, request)
        return handler

    return register

