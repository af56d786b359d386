"""The catalog ([[models]]) against this box: how many cards each entry needs, and which entries cannot run here.

The config load checks what the text alone says (app.config._models); this module opens the files, so it runs
where they may be read: `board agent` at its start (it refuses a bad catalog) and the service's on-demand
booking (a group of `cards_needed` cards of the entry's pool). A booking may land on any group of its pool, so an
entry is sized on the pool's smallest card.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from app.core.request import CACHE_TYPES, MAX_PARALLEL
from app.errors import BadInput
from app.fit.estimate import CARD_COUNTS, Settings, place
from app.fit.gguf_model import Model, read_model
from app.fit.report import DEFAULT_CARD_MIB
from app.llama.command import check_extra
from app.llama.flags import under

if TYPE_CHECKING:
    from app.config import CatalogModel, Config, FitSettings
    from app.gpu.model import CardReading

# path -> ((size, mtime_ns), its model, its answers by request): a repeated sizing reads the header again, and
# places the model again, only when the file changed (placing a model takes milliseconds: the service sizes on each
# demand and each `board models`)
_models: dict[str, tuple[tuple[int, int], Model, dict[tuple, int | None]]] = {}


def _model(path: str) -> tuple[Model, dict[tuple, int | None]]:
    try:
        stat = os.stat(path)
    except OSError:
        _models.pop(path, None)
        return read_model(path), {}  # words the refusal (missing, unreadable)
    key = (stat.st_size, stat.st_mtime_ns)
    cached = _models.get(path)
    if cached is None or cached[0] != key:
        cached = _models[path] = (key, read_model(path), {})
    return cached[1], cached[2]


def settings_of(entry: CatalogModel) -> Settings:
    """The entry's server in memory terms (flash attention on, as board starts every server)."""
    return Settings(ctx=entry.ctx, parallel=entry.parallel, cache_type_k=entry.cache_type_k,
                    cache_type_v=entry.cache_type_v)


def cards_needed(entry: CatalogModel, card_mib: Sequence[float], settings: FitSettings) -> int | None:
    """The smallest group (1, 2, 4 or 8, no more than `card_mib` has cards) on which the fit estimate fits the
    entry on cards of the smallest of `card_mib`; None: none does. BadInput (one line) for a file board cannot
    read or size, or settings llama.cpp would refuse for this model."""
    if not card_mib:
        return None
    model, answers = _model(entry.model)
    wanted = settings_of(entry)
    request = (wanted, min(card_mib), len(card_mib), settings.overhead_mib, settings.max_fill)
    if request not in answers:
        answers[request] = next((n for n in CARD_COUNTS if n <= len(card_mib) and place(
            model, wanted, n, card_mib=request[1], overhead_mib=settings.overhead_mib, max_fill=settings.max_fill).fits),
            None)
    return answers[request]


def pool_cards(config: Config, entry: CatalogModel, cards: Sequence[CardReading]) -> list[CardReading]:
    """The readings of the cards the entry's pool names (every card when it names none), in index order."""
    pool = next((p for p in config.pools if p.name == entry.pool), None)
    wanted = None if pool is None else set(pool.cards)
    return sorted((c for c in cards if wanted is None or c.index in wanted), key=lambda c: c.index)


def card_memory(config: Config, cards: Sequence[CardReading]) -> list[float]:
    """Each card's memory in MiB: [fit] card_mib where set, else what the card reports, else an RTX 5090's."""
    return [float(config.fit.card_mib or c.memory_total_mib or DEFAULT_CARD_MIB) for c in cards]


def check_catalog(config: Config, cards: Sequence[CardReading]) -> list[str]:
    """One line per catalog entry that cannot run on this box (`cards`: the first readings): more slots than llama.cpp
    has, a cache type it lacks, an extra argument off the allow-list; its file is missing, not a regular file, or
    outside [llama] model_dirs once symlinks are resolved; board cannot read or size it; or it fits on no group of
    its pool's cards. [] when every entry can."""
    dirs = [os.path.realpath(d) for d in config.llama.model_dirs if os.path.isabs(d)]
    lines = []
    for number, entry in enumerate(config.models, 1):
        problem = _problem(config, entry, cards, dirs)
        if problem:
            lines.append(f"[[models]] #{number} ({entry.alias}): {problem}")
    return lines


def spec_problem(entry: CatalogModel, model_dirs: Sequence[str]) -> str | None:
    """What llama.cpp's facts refuse in the entry's server spec, as `serve start` refuses it; None when nothing."""
    if entry.parallel > MAX_PARALLEL:
        return f"parallel is {entry.parallel}, more than llama.cpp's limit ({MAX_PARALLEL}); give fewer slots"
    for key in ("cache_type_k", "cache_type_v"):
        if getattr(entry, key) not in CACHE_TYPES:
            return f"{key} is {getattr(entry, key)[:20]!r}; use one of {', '.join(CACHE_TYPES)}"
    try:
        check_extra(entry.args, model_dirs)
    except BadInput as error:
        return f"args: {error}"
    return None


def _problem(config: Config, entry: CatalogModel, cards: Sequence[CardReading], dirs: list[str]) -> str | None:
    if problem := spec_problem(entry, config.llama.model_dirs):
        return problem
    path = entry.model
    real = os.path.realpath(path)
    if not os.path.lexists(path):
        return f"no model file {path}; put the file there or correct model"
    if not os.path.isfile(real):
        return f"{path} is not a regular file; give a .gguf file under [llama] model_dirs"
    if not under(real, dirs):
        return (f"{path} is {real} once symlinks are resolved, outside [llama] model_dirs"
                f" ({', '.join(dirs) or 'none'}); move the file or the link under them")
    group = pool_cards(config, entry, cards)
    where = f"pool {entry.pool}" if entry.pool else "this box"
    if not group:
        if entry.pool:
            return f"pool {entry.pool} has none of its cards on this box; give a pool whose cards are here"
        return "this box reports no cards, so no model can run here"
    try:
        needed = cards_needed(entry, card_memory(config, group), config.fit)
    except BadInput as error:
        return f"{error}; give a model board can size (board fit shows why)"
    if needed is None:
        memory = min(card_memory(config, group))
        return (f"{os.path.basename(path)} with ctx {entry.ctx}, parallel {entry.parallel} fits on no group of the"
                f" {len(group)} cards of {where} ({memory:.0f} MiB each); lower ctx or parallel, use a q8_0 cache or a"
                " smaller quantisation, or a pool with more cards (board fit shows the figures)")
    return None
