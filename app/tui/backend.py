"""What the screens ask of the service, as awaitables: every call runs on one worker thread.

Screens never hold a connection or a rule object. They call these methods, which send the
operation through the client (in-process or over the socket, the screens cannot tell) and
raise the service's errors (BadInput, Conflict, NotPermitted) whose str() is the line to show.
"""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import datetime, tzinfo
from functools import partial
from functools import cached_property
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

from app.config import Config
from app.errors import BadInput, BoardError, NotPermitted
from app.core.text import inert
from app.model import Booking, Event, booking_from_wire

if TYPE_CHECKING:  # app.fit loads when a model is first sized, not at the board's start
    from app.fit.estimate import Placement, Settings
    from app.fit.gguf_model import Model

# How far the form looks for models under [llama] model_dirs: a share mounted over the network can be huge.
MODEL_LIMIT = 2000  # .gguf files listed at most
MODEL_DEPTH = 4  # folders below a model dir (a Hugging Face cache keeps its files 3 below)
MODEL_VISITS = 20000  # directory entries looked at, in all


@dataclass(frozen=True, slots=True)
class ModelAsk:
    """A request in memory terms: the model file and the server settings it will run with."""

    path: str
    settings: Settings


@dataclass(frozen=True, slots=True)
class BookingRequest:
    """A parsed booking form: explicit cards or a count (or, with a model, neither: the smallest group that
    fits), and a half-open [start, end). `record` is what the booking stores of the model once sized."""

    cards: tuple[int, ...] | None
    count: int | None
    start: int
    end: int
    klass: str
    note: str = ""
    model: ModelAsk | None = None
    record: dict | None = None
    or_later: bool = False  # the earliest start from `start` on, and the queue (book --or-later)
    host: str | None = None  # the host the cards are on (the form's 'gpu2:0-3'); None: this host
    project: str | None = None  # the project it is for ([[projects]]); None: the service's choice (board book's)

    def args(self) -> dict[str, Any]:
        return {"cards": list(self.cards) if self.cards is not None else None, "count": self.count,
                "start": self.start, "end": self.end, "class": self.klass,
                **({"host": self.host} if self.host is not None else {}),
                **({"project": self.project} if self.project is not None else {})}

    def plan_args(self) -> dict[str, Any]:
        return {**self.args(), **({"or_later": True} if self.or_later else {})}

    def sized(self, sizing: Sizing) -> BookingRequest:
        """This request on the cards the model needs: the count filled in when none was given, and the
        record to store. NotPermitted, with the one line to show, when it does not fit."""
        if not sizing.fits:
            raise NotPermitted(sizing.refusal())
        given = self.cards is not None or self.count is not None
        return replace(self, count=self.count if given else sizing.placement.cards, record=sizing.record())


def _mib(value: float) -> str:
    return f"{value:,.0f}" if value >= 10 else f"{value:.1f}"


@dataclass(frozen=True, slots=True)
class Sizing:
    """A model's memory on the form's cards. `placement` is on the cards asked for (named or counted), else on
    the smallest group that fits, else on 8; `cards` names them when the form did."""

    model: Model
    settings: Settings
    placement: Placement
    smallest_fit: int | None
    cards: tuple[int, ...] | None = None
    chosen: bool = False  # the form gave the cards or the count; False: the board picks the smallest fit

    @property
    def fits(self) -> bool:
        return self.placement.fits

    def record(self) -> dict:
        from app.fit.report import request_record

        return request_record(self.placement, self.model, self.settings)

    def line(self) -> str:
        """'≈ 9,812 MiB per card (weights 7,100 + KV 1,800 + compute 412 + overhead 500) · fits 1 card', or
        'does not fit on 1 card: the card needs 31,200 MiB, over the 29,346 MiB limit; fits on 2 cards'."""
        p = self.placement
        index, fullest = max(enumerate(p.per_card), key=lambda pair: pair[1].total_mib)
        n = f"{p.cards} card{'s' if p.cards != 1 else ''}"
        if p.fits:
            parts = (f"weights {_mib(fullest.weights_mib)} + KV {_mib(fullest.kv_mib)} + "
                     f"compute {_mib(fullest.compute_mib)} + overhead {_mib(fullest.overhead_mib)}")
            fits = f"fits {n}" if self.chosen else f"books {n}, the fewest that fit"
            return f"≈ {_mib(fullest.total_mib)} MiB per card ({parts}) · {fits}"
        if self.cards is not None:
            who = f"card {self.cards[index]}"
        else:
            who = "the card" if p.cards == 1 else "the fullest card"
        over = f"{who} needs {_mib(fullest.total_mib)} MiB, over the {_mib(p.limit_mib)} MiB limit"
        if not self.chosen:  # not even the smallest group fits: the placement is on 8
            return f"does not fit even on {n}: {over}; lower the context or parallel"
        if self.smallest_fit is None:
            return f"does not fit on {n}: {over}; no group of up to 8 fits: lower the context or parallel"
        return f"does not fit on {n}: {over}; fits on {self.smallest_fit} card{'s' if self.smallest_fit != 1 else ''}"


    def refusal(self) -> str:
        """Why Enter refuses, in one line; the live line above it shows the figures."""
        name = inert(os.path.basename(self.model.path), 80)
        n = f"{self.placement.cards} card{'s' if self.placement.cards != 1 else ''}"
        if not self.chosen:
            return f"{name} does not fit even on {n}: lower the context or parallel"
        if self.smallest_fit is None:
            return f"{name} does not fit on {n}, nor on 8: lower the context or parallel"
        k = self.smallest_fit
        return (f"{name} does not fit on {n}; it fits on {k}: ask for {k}, or leave cards and count empty "
                "for the fewest that fit")


def find_models(dirs: Iterable[str], *, limit: int = MODEL_LIMIT, depth: int = MODEL_DEPTH,
                visits: int = MODEL_VISITS) -> list[str]:
    """The .gguf files under `dirs`, as absolute paths, sorted: at most `limit` of them, `depth` folders down,
    `visits` entries looked at. A split model shows once, as its first part (the estimate reads all parts).
    Folders that can't be read are passed over; links to files count, links to folders are not followed."""
    found: set[str] = set()
    seen = 0
    pending = [(os.path.abspath(os.path.expanduser(d)), 0) for d in dirs]
    while pending and len(found) < limit and seen < visits:
        folder, level = pending.pop(0)
        try:
            with os.scandir(folder) as entries:
                listed = sorted(entries, key=lambda e: e.name)
        except OSError:
            continue
        for entry in listed:
            seen += 1
            if seen > visits or len(found) >= limit:
                break
            try:
                if entry.is_dir(follow_symlinks=False):
                    if level < depth and not entry.name.startswith("."):
                        pending.append((entry.path, level + 1))
                elif entry.name.endswith(".gguf") and entry.is_file() and not _later_part(entry.name):
                    found.add(entry.path)
            except OSError:
                continue
    return sorted(found)


def _later_part(name: str) -> bool:
    """'-00002-of-00003.gguf' and later: parts that the first part's estimate already sums."""
    stem = name[: -len(".gguf")]
    part, _, rest = stem.rpartition("-of-")
    return bool(part) and rest.isdigit() and part[-5:].isdigit() and int(part[-5:]) > 1


@dataclass(frozen=True, slots=True)
class Budget:
    """A project's GPU-hour budget this period, as the `projects` operation answers for each project: the hours used
    (before now) and booked ahead (now to the reset), what is left (None: no budget), when it resets, and whether
    the caller is a member."""

    project: str
    gpu_hours: float | None
    period: str  # month | week
    used_hours: float
    booked_hours: float
    remaining_hours: float | None
    resets_at: int
    mine: bool

    def line(self, tz: tzinfo | None) -> str:
        """'B: 6.5 of 20 GPU-hours left this month, resets 1 Dec' (the reset's date in the policy zone `tz`)."""
        name = inert(self.project, 40)
        if self.gpu_hours is None or self.remaining_hours is None:
            return f"{name}: no GPU-hour budget"
        reset = datetime.fromtimestamp(self.resets_at, tz)
        when = f"resets {reset.day} {reset:%b}"
        if self.remaining_hours < 0:  # past it (an admin's --force)
            return f"{name}: {-self.remaining_hours:.1f} GPU-hours over its {self.gpu_hours:g} this {self.period}, {when}"
        return f"{name}: {self.remaining_hours:.1f} of {self.gpu_hours:g} GPU-hours left this {self.period}, {when}"


@dataclass(frozen=True, slots=True)
class Plan:
    cards: tuple[int, ...]
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class Booked:
    """A new booking, and the service's notes on what runs on its cards now (cards passed over, or
    another user's processes on a named card): one line each, other users' names in them."""

    booking: Booking
    notes: tuple[str, ...] = ()


class Backend:
    def __init__(self, client, clock: Callable[[], float], on_change: Callable[[], None] = lambda: None,
                 config: Config | None = None) -> None:
        self.client, self.clock, self.config = client, clock, config or Config()
        self._on_change = on_change  # reloads the bookings at once after one of our own writes
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="board-calls")
        # Model files are read on a thread of their own: a big vocabulary takes seconds, service calls must not wait.
        self._fit_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="board-fit")
        self._models: dict[str, tuple[tuple[int, int], Model]] = {}  # path -> ((mtime_ns, size), model); fit thread only

    async def call(self, op: str, **args: Any) -> Any:
        """One operation off the UI thread; the service's error comes back to the caller."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, partial(self._call, op, **args))

    def _call(self, op: str, **args: Any) -> Any:
        try:
            return self.client.call(op, **args)
        except BoardError as error:
            str(error)  # a refusal's second half is asked for when first worded (BoardError.rest): here, off the UI
            raise

    async def _write(self, op: str, **args: Any) -> dict[str, Any]:
        try:
            return await self.call(op, **args)
        finally:
            self._on_change()

    async def _change(self, op: str, **args: Any) -> Booking:
        return booking_from_wire(await self._write(op, **args))

    @cached_property
    def fit_limits(self) -> dict:
        """card_mib, overhead_mib, max_fill: the config's [fit]."""
        from app.fit.request import limits

        return limits(self.config)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._fit_executor.shutdown(wait=False, cancel_futures=True)

    # -- models --------------------------------------------------------------------------------

    async def model_files(self, dirs: Sequence[str]) -> list[str]:
        """The .gguf files under [llama] model_dirs (bounded: see find_models), for completion."""
        return await asyncio.get_running_loop().run_in_executor(self._fit_executor, find_models, tuple(dirs))

    async def size(self, request: BookingRequest) -> Sizing:
        """The request's model on its cards (named, counted, or the smallest group that fits). BadInput with one
        line for a file that is missing or can't be sized."""
        if request.model is None:
            raise BadInput("no model to size")
        return await asyncio.get_running_loop().run_in_executor(self._fit_executor, self._size, request)

    def _model(self, path: str) -> Model:
        """read_model, once per file version: the header of a big vocabulary takes seconds to read."""
        from app.fit.gguf_model import read_model

        path = os.path.abspath(os.path.expanduser(path))
        try:
            info = os.stat(path)
        except OSError:
            return read_model(path)  # its one-line reason: missing, a directory, unreadable
        version = (info.st_mtime_ns, info.st_size)
        cached = self._models.get(path)
        if cached is not None and cached[0] == version:
            return cached[1]
        model = read_model(path)
        self._models[path] = (version, model)
        return model

    def _size(self, request: BookingRequest) -> Sizing:
        from app.fit.estimate import place
        from app.fit.report import fit

        ask = request.model
        assert ask is not None
        try:
            model = self._model(ask.path)
            smallest = fit(model, ask.settings, **self.fit_limits).smallest_fit
            chosen = request.cards is not None or request.count is not None
            if request.cards is not None:
                n = len(request.cards)
            elif request.count is not None:
                n = request.count
            else:
                n = smallest or 8
            placement = place(model, ask.settings, n, **self.fit_limits)
        except BoardError:
            raise
        except Exception as error:  # noqa: BLE001 - a header the estimate can't follow is one line in the form
            raise BadInput(f"can't size {ask.path}: {type(error).__name__}: {str(error)[:120]}") from None
        return Sizing(model, ask.settings, placement, smallest, request.cards, chosen)

    async def _sized(self, request: BookingRequest) -> BookingRequest:
        if request.model is None or request.record is not None:
            return request
        return request.sized(await self.size(request))

    # -- bookings ------------------------------------------------------------------------------

    # A request with a model is sized first (request.sized): the count becomes the smallest group that fits,
    # and one that does not fit its cards is refused here, before the service hears of it.

    async def plan(self, request: BookingRequest) -> Plan:
        request = await self._sized(request)
        found = await self.call("plan", **request.plan_args())
        return Plan(tuple(found["cards"]), found["start"], found["end"])

    async def create(self, request: BookingRequest) -> Booked:
        """Check, then book; a request that fails the check writes nothing at all. A model's request (the
        settings and the estimate per card) is stored with the booking."""
        request = await self._sized(request)
        found = await self._write("book", **request.plan_args(), note=request.note, request=request.record, checked=True)
        return Booked(booking_from_wire(found), tuple(found.get("notes", ())))

    async def next_free(self, request: BookingRequest) -> tuple[tuple[int, ...], int]:
        """The earliest (cards, start) at or after the request's start that fits its duration; with a model and
        no count, for the smallest group of cards that fits it."""
        request = await self._sized(request)
        found = await self.call("next_free", **request.args())
        return tuple(found["cards"]), found["start"]

    async def cancel(self, booking_id: int) -> Booking:
        return await self._change("cancel", id=booking_id)

    async def release(self, booking_id: int) -> Booking:
        return await self._change("release", id=booking_id)

    async def extend(self, booking_id: int, end: int) -> Booking:
        return await self._change("extend", id=booking_id, end=end)

    async def reassign(self, booking_id: int, *, cards: Sequence[int] | None = None, user: str | None = None) -> Booking:
        return await self._change("reassign", id=booking_id, cards=list(cards) if cards is not None else None, user=user)

    # -- lists ---------------------------------------------------------------------------------

    async def all_bookings(self, since: int) -> list[Booking]:
        """Every booking (cancelled too) that ends after `since`: the admin list."""
        return [booking_from_wire(b) for b in await self.call("all_bookings", since=since)]

    async def audit_log(self, limit: int = 200) -> list[Event]:
        return [Event(**e) for e in await self.call("log", limit=limit)]

    # -- projects ------------------------------------------------------------------------------

    async def budgets(self) -> dict[str, Budget]:
        """Each project's budget this period, by name, as the `projects` operation answers ({} on a board without
        projects)."""
        reply = await self.call("projects")
        return {p["name"]: Budget(p["name"], p["gpu_hours"], p["period"], p["used_hours"], p["booked_hours"],
                                  p["remaining_hours"], p["resets_at"], p["mine"]) for p in reply["projects"]}
