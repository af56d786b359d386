"""`board fit`: the estimate for 1, 2, 4 and 8 cards, the smallest group that fits, and the seeds' advice."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace

from app.fit.estimate import CARD_COUNTS, MIB, CardUse, Placement, Settings, place
from app.fit.gguf_model import Model

DEFAULT_CARD_MIB = 32607  # an RTX 5090 as NVML reports it


@dataclass(frozen=True)
class Fit:
    model: Model
    settings: Settings
    options: tuple[Placement, ...]  # every card count, so the smallest fit is always searched in full
    measured: dict | None = None  # a server of this model and settings, and what llama.cpp logged for it
    cards: int | None = None  # `--cards N`: the table shows only this count

    @property
    def smallest_fit(self) -> int | None:
        return next((o.cards for o in self.options if o.fits), None)

    @property
    def shown(self) -> tuple[Placement, ...]:
        """The table's rows: every count, or only `--cards N`'s."""
        return tuple(o for o in self.options if self.cards in (None, o.cards))

    def option(self, cards: int) -> Placement | None:
        return next((o for o in self.options if o.cards == cards), None)

    def as_json(self) -> dict:
        one = self.options[0]
        kv = sum(c.kv_mib for c in one.per_card)
        compute = sum(c.compute_mib for c in one.per_card) + one.host_compute_mib
        return {
            "model": self.model.path, "n_layer": self.model.n_layer, "ctx": self.settings.ctx,
            "parallel": self.settings.parallel, "cache_type_k": self.settings.cache_type_k,
            "cache_type_v": self.settings.cache_type_v,
            "weights_mib": round(self.model.weights_bytes / MIB, 1), "kv_mib": round(kv, 1),
            "compute_mib": round(compute, 1), "host_mib": round(one.host_mib, 1),
            "options": [o.as_dict() for o in self.shown], "smallest_fit": self.smallest_fit,
            **({"measured": self.measured} if self.measured else {}),
        }


def fit(model: Model, settings: Settings, *, card_mib: float = DEFAULT_CARD_MIB, overhead_mib: float = 500.0,
        max_fill: float = 0.90, cards: int | None = None) -> Fit:
    return Fit(model, settings, tuple(place(model, settings, n, card_mib=card_mib, overhead_mib=overhead_mib,
                                            max_fill=max_fill) for n in CARD_COUNTS), cards=cards)


def advice(result: Fit) -> str:
    """The seeds' rule in one line: the smallest group that fits, TP2/TP4 over TP8."""
    n = result.smallest_fit
    if n is None:
        return ("Does not fit even on 8 cards: lower --ctx or --parallel, use a q8_0 cache "
                "(--cache-type-k q8_0 --cache-type-v q8_0), or a smaller quantisation.")
    if n == 1:
        return "Fits on one card: book 1. Splitting a model that fits only adds transfers between cards."
    if n in (2, 4):
        return f"Fits on {n} cards (TP{n}): book {n}. A model that fits on {n} gains nothing from 8; prefer TP2/TP4."
    return "Needs all 8 cards: book the whole machine, and check that a smaller context or quantisation won't do."


def _mib(value: float) -> str:
    return f"{value:,.0f}" if value >= 10 else f"{value:.1f}"


def render(result: Fit) -> str:
    m, s = result.model, result.settings
    slots = f"{s.parallel} slot{'s' if s.parallel != 1 else ''}"
    per_slot = f"{s.ctx // s.parallel:,} tokens each" if not s.unified else "one shared cache"
    totals = result.as_json()
    lines = [
        f"model    {m.path}",
        f"         {m.arch}, {m.n_layer} layers, {m.weight_type}, {m.file_bytes / (1 << 30):.2f} GiB"
        + (f", {m.n_expert} experts ({m.n_expert_used} used)" if m.n_expert else ""),
        f"request  ctx {s.ctx:,}, {slots} ({per_slot}), KV cache {s.cache_type_k}/{s.cache_type_v}, "
        f"flash attention {'on' if s.flash_attn else 'off'}",
        f"total    weights {_mib(totals['weights_mib'])} MiB ({_mib(result.options[0].host_weights_mib)} of it on the host), "
        f"KV {_mib(totals['kv_mib'])} MiB, compute {_mib(totals['compute_mib'])} MiB",
        "",
        f"cards  MiB on the fullest card: weights + KV + compute + overhead = total      "
        f"fits (limit {_mib(result.options[0].limit_mib)})",
    ]
    for option in result.shown:
        fullest = max(option.per_card, key=lambda c: c.total_mib)
        sum_line = (f"{_mib(fullest.weights_mib):>7} + {_mib(fullest.kv_mib):>6} + {_mib(fullest.compute_mib):>6} + "
                    f"{_mib(fullest.overhead_mib):>4} = {_mib(fullest.total_mib):>7}")
        every = " ".join(_mib(c.total_mib) for c in option.per_card) if option.cards > 1 else ""
        lines.append(f"{option.cards:>5}  {sum_line}   {'yes' if option.fits else 'NO':<4}{'  cards: ' + every if every else ''}")
    if (measured := result.measured) is not None:
        when = time.strftime("%d %b", time.localtime(measured["ready_at"])) if measured.get("ready_at") else "?"
        used = (f"the {measured['cards']}-card row uses its figures" if measured["per_card"]
                else f"{_mib(measured['total_mib'])} MiB in all")
        lines += ["", f"measured on this server on {when} (server {measured['server']}): {used}"]
    n = result.smallest_fit
    lines += ["", f"smallest fit: {n} card{'s' if n != 1 else ''}" if n else "smallest fit: none", advice(result)]
    return "\n".join(lines)



def overflow(placement: Placement) -> str:
    """'card 1 needs 31,200 MiB, 1,854 over the 29,346 MiB limit' for the fullest card over the limit."""
    index, worst = max(enumerate(placement.per_card), key=lambda pair: pair[1].total_mib)
    over = worst.total_mib - placement.limit_mib
    return (f"card {index} of {placement.cards} needs {_mib(worst.total_mib)} MiB, {_mib(over)} MiB over the "
            f"{_mib(placement.limit_mib)} MiB limit")


def alternatives(model: Model, settings: Settings, cards: int, **limits) -> list[str]:
    """What would fit instead, each as the option to change: a smaller context, fewer slots, a q8_0
    cache, or more cards."""
    def fits(s: Settings, n: int = cards) -> bool:
        try:
            return place(model, s, n, **limits).fits
        except Exception:  # noqa: BLE001 - a variant llama.cpp would refuse is simply not offered
            return False

    found = []
    ctx = settings.ctx
    while ctx > 512 and not fits(replace(settings, ctx=ctx)):
        ctx //= 2
    if ctx != settings.ctx and fits(replace(settings, ctx=ctx)):
        found.append(f"--ctx {ctx}")
    if settings.parallel > 1:
        fewer = next((p for p in range(settings.parallel - 1, 0, -1) if fits(replace(settings, parallel=p))), None)
        if fewer:
            found.append(f"--parallel {fewer}")
    if settings.cache_type_k == "f16" and fits(replace(settings, cache_type_k="q8_0", cache_type_v="q8_0", flash_attn=True)):
        found.append("--cache-type-k q8_0 --cache-type-v q8_0" + ("" if settings.flash_attn else " --flash-attn on"))
    more = next((n for n in CARD_COUNTS if n > cards and fits(settings, n)), None)
    if more:
        found.append(f"{more} cards")
    return found


def request_record(result: Placement, model: Model, settings: Settings) -> dict:
    """What a booking stores of its request: enough to serve it again and to compare with what is used."""
    return {"model": model.path, **settings.as_dict(), "cards_planned": result.cards,
            "per_card_mib": [round(c.total_mib) for c in result.per_card],
            "estimate": [c.as_dict() for c in result.per_card]}


def _flag(cmdline: list, flag: str, default: str) -> str:
    return cmdline[cmdline.index(flag) + 1] if flag in cmdline[:-1] else default


def same_request(server: dict, model: Model, settings: Settings) -> bool:
    """A server of this model run with these settings (its command line says which cache and attention)."""
    cmdline = list(server.get("cmdline") or [])
    return (server.get("model") == os.path.realpath(model.path) and server.get("ctx") == settings.ctx
            and server.get("parallel") == settings.parallel
            and _flag(cmdline, "-ctk", "f16") == settings.cache_type_k and _flag(cmdline, "-ctv", "f16") == settings.cache_type_v
            and _flag(cmdline, "-fa", "auto") == ("on" if settings.flash_attn else "off")
            and ("-kvu" in cmdline) == settings.unified)


def with_measured(result: Fit, server: dict, *, overhead_mib: float) -> Fit:
    """The estimate, with the option of the server's card count replaced by what llama.cpp measured on those
    cards (CUDA0.. in the server's card order, plus the overhead llama.cpp does not count)."""
    devices = (server.get("measured") or {}).get("devices") or {}
    n = len(server.get("cards") or ())
    names = [f"CUDA{i}" for i in range(n)]
    measured = {"server": server.get("id"), "ready_at": server.get("ready_at"), "cards": n,
                "total_mib": round(sum(sum(float(v) for k, v in d.items() if k.endswith("_mib")) for d in devices.values()), 1),
                "per_card": None}
    options = list(result.options)
    if n and all(name in devices for name in names):
        per_card = tuple(CardUse(float(devices[name]["weights_mib"]), float(devices[name]["kv_mib"]),
                                 float(devices[name]["compute_mib"]) + float(devices[name].get("output_mib", 0)),
                                 overhead_mib) for name in names)
        measured["per_card"] = [c.as_dict() for c in per_card]
        options = [replace(o, per_card=per_card, fits=all(c.total_mib <= o.limit_mib for c in per_card))
                   if o.cards == n else o for o in options]
    return replace(result, options=tuple(options), measured=measured)
