"""app.llama.catalog against real GGUFs the tests write: how many cards a catalog entry needs (cards_needed), and
which entries cannot run on a box's cards (check_catalog, what `board agent` refuses at its start)."""

from __future__ import annotations

import json
import os

import pytest

from app.config import CatalogModel, FitSettings, load_config
from app.fit.estimate import Settings, place
from app.fit.gguf_model import read_model
from app.gpu.model import CardReading
from app.llama import catalog
from tests.fit.shapes import Shape, write_model
from tests.llama.tiny_gguf import write_tiny_gguf

# Weights spread over 8 layers outweigh the compute buffers: each doubling of the group lowers the fullest card.
HEAVY = Shape("heavy", n_embd=256, n_layer=8, n_head=4, n_head_kv=4, n_ff=2048, dtype="F32")
EXACT = FitSettings(overhead_mib=0.0, max_fill=1.0)  # a card holds exactly its memory: the boundaries are the estimate's
CTX = 512


@pytest.fixture(scope="module")
def heavy(tmp_path_factory) -> str:
    return str(write_model(tmp_path_factory.mktemp("models") / "heavy.gguf", HEAVY))


def fullest(path: str, cards: int) -> float:
    """The estimate's fullest card for `cards` cards, in MiB: what a card must hold for that group to fit."""
    placement = place(read_model(path), Settings(ctx=CTX), cards, card_mib=1e9, overhead_mib=0.0, max_fill=1.0)
    return max(card.total_mib for card in placement.per_card)


def entry(path: str, **keys) -> CatalogModel:
    return CatalogModel(alias="heavy", model=path, ctx=CTX, **keys)


def test_the_model_needs_more_memory_on_fewer_cards(heavy):
    """The setup the boundaries below stand on: 1 card must hold more than each of 2, and 2 more than each of 4."""
    assert fullest(heavy, 1) > fullest(heavy, 2) > fullest(heavy, 4)


def test_exactly_two_cards_worth(heavy):
    """Cards that hold exactly the fullest card of a pair: 2 (not 1, which needs more). A MiB less: 4. Nearest wrong
    versions: the fit taken as `<` (2 refused at its exact figure), the largest group returned, the first size tried
    being 2."""
    two = fullest(heavy, 2)
    assert catalog.cards_needed(entry(heavy), [two] * 8, EXACT) == 2
    assert catalog.cards_needed(entry(heavy), [two - 1] * 8, EXACT) == 4
    assert catalog.cards_needed(entry(heavy), [fullest(heavy, 1)] * 8, EXACT) == 1


def test_a_pool_of_three_cannot_give_four(heavy):
    """Cards a MiB short of a pair's need: 4 are needed, and a pool of 3 has no group of 4 (None); a pool of 4 does.
    Nearest wrong versions: groups up to 8 whatever the pool holds, a pool of 3 offered as 2 + 1."""
    small = fullest(heavy, 2) - 1
    assert catalog.cards_needed(entry(heavy), [small] * 3, EXACT) is None
    assert catalog.cards_needed(entry(heavy), [small] * 4, EXACT) == 4
    assert catalog.cards_needed(entry(heavy), [], EXACT) is None


def test_a_pool_is_sized_on_its_smallest_card(heavy):
    """A booking may land on any group of the pool, so the smallest card decides: one card short of a pair's need
    among big ones makes 4. Nearest wrong version: the largest card (or the first) sizing the group."""
    two = fullest(heavy, 2)
    assert catalog.cards_needed(entry(heavy), [two * 4, two * 4, two - 1, two * 4], EXACT) == 4


def test_the_fit_settings_count(heavy):
    """[fit] overhead_mib and max_fill shrink what a card holds. Nearest wrong version: the defaults used instead."""
    two = fullest(heavy, 2)
    assert catalog.cards_needed(entry(heavy), [two + 100] * 8, FitSettings(overhead_mib=100.0, max_fill=1.0)) == 2
    assert catalog.cards_needed(entry(heavy), [two + 100] * 8, FitSettings(overhead_mib=101.0, max_fill=1.0)) == 4
    assert catalog.cards_needed(entry(heavy), [two / 0.5] * 8, FitSettings(overhead_mib=0.0, max_fill=0.5)) == 2


def test_the_entry_settings_count(heavy):
    """A longer context needs more cards, a wider cache too. Nearest wrong versions: a CatalogModel's defaults sized
    (ctx 4096, which needs 8 here), the cache types left out (f16 sized)."""
    two = fullest(heavy, 2)
    assert catalog.cards_needed(entry(heavy), [two] * 8, EXACT) == 2
    assert catalog.cards_needed(entry(heavy, cache_type_k="f32"), [two] * 8, EXACT) > 2
    assert catalog.cards_needed(entry(heavy, cache_type_v="f32"), [two] * 8, EXACT) > 2
    assert catalog.cards_needed(CatalogModel(alias="heavy", model=heavy, ctx=CTX * 8), [two] * 8, EXACT) == 8


def test_a_repeated_sizing_reads_the_file_once(tmp_path, monkeypatch):
    """The header is read, and the model placed, again only when the file's size or mtime changed or another
    request is sized. Nearest wrong versions: no cache (a read per call), a cache by path alone (a replaced file
    sized as the old one), answers kept whatever the cards (another card size answered as the first)."""
    path = str(tmp_path / "m.gguf")
    write_tiny_gguf(path)
    reads, placed = [], []
    real_read, real_place = catalog.read_model, catalog.place
    monkeypatch.setattr(catalog, "read_model", lambda p: reads.append(p) or real_read(p))
    monkeypatch.setattr(catalog, "place", lambda *a, **k: placed.append(a[2]) or real_place(*a, **k))
    tiny = CatalogModel(alias="tiny", model=path)
    for _ in range(3):
        assert catalog.cards_needed(tiny, [32607.0], FitSettings()) == 1
    assert (reads, placed) == ([path], [1])
    assert catalog.cards_needed(tiny, [1.0, 1.0], FitSettings()) is None  # other cards: placed again, not read
    assert (reads, placed) == ([path], [1, 1, 2])
    write_model(path, HEAVY)  # replaced: another size
    os.utime(path, ns=(1, 1))
    too_small = fullest(path, 1) - 1
    assert catalog.cards_needed(CatalogModel(alias="tiny", model=path, ctx=CTX), [too_small], EXACT) is None
    assert reads == [path, path]


def test_a_file_board_cannot_read_is_bad_input(tmp_path):
    """One line, BadInput: a missing file, one that is not a GGUF."""
    from app.errors import BadInput

    (tmp_path / "text.gguf").write_text("not a model")
    for path, words in ((tmp_path / "none.gguf", "no model file"), (tmp_path / "text.gguf", "is not a GGUF file")):
        with pytest.raises(BadInput, match=words):
            catalog.cards_needed(CatalogModel(alias="x", model=str(path)), [32607.0], FitSettings())


# -- check_catalog: the box's cards and the files ------------------------------------------------------------


def _config(tmp_path, entries: list[dict], pools: str = "", fit: str = ""):
    lines = [f"[llama]\nmodel_dirs = [{json.dumps(str(tmp_path / 'models'))}]\n", pools, fit]
    for e in entries:
        lines += ["[[models]]", *(f"{k} = {json.dumps(v)}" for k, v in e.items()), ""]
    (tmp_path / "board.toml").write_text("\n".join(lines))
    return load_config(environ={"BOARD_CONFIG": str(tmp_path / "board.toml")})


def readings(*mib: int | None) -> list[CardReading]:
    return [CardReading(index=i, uuid=f"GPU-{i}", memory_total_mib=m) for i, m in enumerate(mib)]


@pytest.fixture
def models(tmp_path, heavy):
    """model_dirs with a good model, a link to it, and the bad ones: a link out of the folder, a folder named .gguf, a
    text file."""
    folder = tmp_path / "models"
    folder.mkdir()
    os.symlink(heavy, folder / "heavy.gguf")  # out of model_dirs once resolved
    write_tiny_gguf(folder / "tiny.gguf")
    os.symlink(folder / "tiny.gguf", folder / "link.gguf")  # a link that stays inside: fine
    (folder / "dir.gguf").mkdir()
    (folder / "text.gguf").write_text("hello")
    return folder


def test_each_bad_entry_is_one_line(tmp_path, models):
    """One line per bad entry, in catalog order, each naming #N and its alias; the good ones (a file, a link that
    stays inside) none. Nearest wrong versions: the first bad entry only, model_dirs compared before symlinks are
    resolved (the link out passes), a directory taken for the file."""
    m = str(models)
    config = _config(tmp_path, [
        {"alias": "good", "model": f"{m}/tiny.gguf"},
        {"alias": "missing", "model": f"{m}/none.gguf"},
        {"alias": "folder", "model": f"{m}/dir.gguf"},
        {"alias": "outside", "model": f"{m}/heavy.gguf"},
        {"alias": "link", "model": f"{m}/link.gguf"},
        {"alias": "text", "model": f"{m}/text.gguf"},
    ])
    real = os.path.realpath(tmp_path / "models" / "heavy.gguf")
    assert catalog.check_catalog(config, readings(32607, 32607)) == [
        f"[[models]] #2 (missing): no model file {m}/none.gguf; put the file there or correct model",
        f"[[models]] #3 (folder): {m}/dir.gguf is not a regular file; give a .gguf file under [llama] model_dirs",
        f"[[models]] #4 (outside): {m}/heavy.gguf is {real} once symlinks are resolved, outside [llama] model_dirs"
        f" ({os.path.realpath(m)}); move the file or the link under them",
        f"[[models]] #6 (text): {m}/text.gguf is not a GGUF file; give a model board can size (board fit shows why)",
    ]


def test_llama_cpps_facts_are_one_line_each_before_the_file(tmp_path, models):
    """What the config's layer cannot know (llama.cpp's slot limit, its cache types, serve start's allow-list for
    extra arguments) is refused here, a line per entry, before the file is opened: a missing file with a bad spec
    is named for the spec. Nearest wrong versions: the limit at 257, one cache type checked of the two, the args
    not checked, a file outside model_dirs let through as an argument."""
    m = str(models)
    good = f"{m}/tiny.gguf"
    config = _config(tmp_path, [
        {"alias": "slots", "model": f"{m}/none.gguf", "ctx": 4096, "parallel": 257},
        {"alias": "most", "model": good, "ctx": 4096, "parallel": 256},
        {"alias": "cache", "model": good, "cache_type_v": "q6_k"},
        {"alias": "managed", "model": good, "args": ["--port", "9000"]},
        {"alias": "outside", "model": good, "args": ["--lora", "/etc/x.gguf"]},
        {"alias": "fine", "model": good, "args": ["--temp", "0.7"]},
    ])
    lines = catalog.check_catalog(config, readings(32607, 32607))
    assert lines == [
        "[[models]] #1 (slots): parallel is 257, more than llama.cpp's limit (256); give fewer slots",
        "[[models]] #3 (cache): cache_type_v is 'q6_k'; use one of f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl",
        "[[models]] #4 (managed): args: extra argument --port is set by board; use board's --port option instead",
        f"[[models]] #5 (outside): args: extra argument --lora takes one file under [llama] model_dirs ({m}), given by"
        " its absolute path; not '/etc/x.gguf'",
    ], lines


def test_a_model_that_fits_no_group_of_its_pool(tmp_path, models, heavy):
    """The pool's cards on this box, each its reported memory: cards a MiB short of a pair's need in a pool of 3 fit
    no group (a line); the same cards in a pool of 4 do (none). Nearest wrong versions: every card of the box sized
    (not the pool's), the pool's cards counted whether the box has them or not, [fit] card_mib ignored."""
    os.unlink(models / "heavy.gguf")
    os.link(heavy, models / "heavy.gguf")  # the file itself, in model_dirs
    small = int(fullest(heavy, 2)) - 1
    pools = ('[[pools]]\nname = "three"\ncards = [0, 1, 2, 9]\n'  # card 9 is not on this box
             '[[pools]]\nname = "four"\ncards = [3, 4, 5, 6]\n'
             '[[pools]]\nname = "gone"\ncards = [12, 13]\n')
    fit = "[fit]\noverhead_mib = 0\nmax_fill = 1.0\n"
    model = str(models / "heavy.gguf")
    entries = [{"alias": "three", "model": model, "ctx": CTX, "pool": "three"},
               {"alias": "four", "model": model, "ctx": CTX, "pool": "four"},
               {"alias": "gone", "model": model, "ctx": CTX, "pool": "gone"}]
    config = _config(tmp_path, entries, pools, fit)
    assert catalog.check_catalog(config, readings(*[small] * 8)) == [
        f"[[models]] #1 (three): heavy.gguf with ctx {CTX}, parallel 1 fits on no group of the 3 cards of pool three"
        f" ({small} MiB each); lower ctx or parallel, use a q8_0 cache or a smaller quantisation, or a pool with more"
        " cards (board fit shows the figures)",
        "[[models]] #3 (gone): pool gone has none of its cards on this box; give a pool whose cards are here",
    ]
    # [fit] card_mib says what a card holds, whatever the cards report: big enough for a pair, all fit
    config = _config(tmp_path, entries, pools, fit + f"card_mib = {int(fullest(heavy, 2)) + 1}\n")
    assert catalog.check_catalog(config, readings(*[small] * 8)) == [
        "[[models]] #3 (gone): pool gone has none of its cards on this box; give a pool whose cards are here"]


def test_a_catalog_that_runs_has_no_lines(tmp_path, models):
    """No pool: every card of the box; a card that reports no memory counts as an RTX 5090's."""
    config = _config(tmp_path, [{"alias": "tiny", "model": str(models / "tiny.gguf")}])
    assert catalog.check_catalog(config, readings(None)) == []
    assert catalog.check_catalog(config, []) == [
        "[[models]] #1 (tiny): this box reports no cards, so no model can run here"]
