"""A request in memory terms against cards (app/fit/request.py), in process: the limits a config gives, how many
cards `book --model` takes, the refusal's wording, `serve start`'s check with and without --force, and which
settings a server runs with. The same through the real CLI is tests/integration/test_fit_by_request.py (a child
process, which mutmut does not see reach this module).

One model ("deep", 12 layers) under limits small enough that the card count matters: with ctx 16384 and 4 slots it
needs two cards (1 card: ~114 MiB, 2 cards: 86 + 70 MiB against a 90 MiB limit)."""

from __future__ import annotations

import pytest

from app.config import Config, FitSettings
from app.errors import NotPermitted
from app.fit.estimate import Settings, place
from app.fit.gguf_model import read_model
from app.fit.report import DEFAULT_CARD_MIB, overflow, request_record
from app.fit.request import for_booking, for_server, limits, settings_of
from tests.fit import shapes

SETTINGS = Settings(ctx=16384, parallel=4)
BOUNDS = {"card_mib": 100, "overhead_mib": 10, "max_fill": 0.9}  # a 90 MiB limit per card
FULL = {"card_mib": 100, "overhead_mib": 95, "max_fill": 0.9}  # the overhead alone is over the limit: nothing fits
INSTEAD = "; would fit: --ctx 8192 or --cache-type-k q8_0 --cache-type-v q8_0 or 2 cards"  # of 1 card, under BOUNDS


@pytest.fixture(scope="module")
def path(tmp_path_factory) -> str:
    """The model under a directory: the refusal names only the file."""
    return str(shapes.write_model(tmp_path_factory.mktemp("models") / "deep.gguf", "deep"))


@pytest.fixture(scope="module")
def model(path):
    return read_model(path)


def refusal(call, *args, **kwargs) -> str:
    with pytest.raises(NotPermitted) as refused:
        call(*args, **kwargs)
    return str(refused.value)


def test_limits_are_the_configs_fit_section_with_the_fleets_card_by_default():
    assert limits(Config()) == {"card_mib": DEFAULT_CARD_MIB, "overhead_mib": 500.0, "max_fill": 0.90}
    given = Config(fit=FitSettings(overhead_mib=100.0, max_fill=0.5, card_mib=600.0))
    assert limits(given) == {"card_mib": 600.0, "overhead_mib": 100.0, "max_fill": 0.5}


def test_book_takes_the_smallest_group_that_fits_unless_told_how_many(path, model):
    assert [place(model, SETTINGS, n, **BOUNDS).fits for n in (1, 2)] == [False, True]  # the setup: 2 is smallest
    two = request_record(place(model, SETTINGS, 2, **BOUNDS), model, SETTINGS)
    assert for_booking(path, SETTINGS, BOUNDS, count=None, cards=None) == (2, two)
    assert two["cards_planned"] == 2 and two["per_card_mib"] == [86, 70] and two["model"] == path
    four = request_record(place(model, SETTINGS, 4, **BOUNDS), model, SETTINGS)
    assert for_booking(path, SETTINGS, BOUNDS, count=None, cards=[0, 1, 5, 6]) == (4, four)  # the cards say how many
    assert for_booking(path, SETTINGS, BOUNDS, count=4, cards=None) == (4, four)
    assert for_booking(path, SETTINGS, BOUNDS, count=8, cards=[0, 1, 5, 6]) == (4, four)  # the cards win


def test_book_refuses_a_count_that_does_not_fit_and_says_what_would(path, model):
    one = overflow(place(model, SETTINGS, 1, **BOUNDS))
    assert one == "card 0 of 1 needs 114 MiB, 24 MiB over the 90 MiB limit"
    assert refusal(for_booking, path, SETTINGS, BOUNDS, count=1, cards=None) == f"book: deep.gguf does not fit: {one}{INSTEAD}"
    assert refusal(for_booking, path, SETTINGS, BOUNDS, count=None, cards=[3]) == f"book: deep.gguf does not fit: {one}{INSTEAD}"


def test_a_model_given_by_its_bare_name_is_named_so(path, model, monkeypatch):
    monkeypatch.chdir(path.rsplit("/", 1)[0])  # `board book --model deep.gguf` in the model's directory
    one = overflow(place(model, SETTINGS, 1, **BOUNDS))
    assert refusal(for_booking, "deep.gguf", SETTINGS, BOUNDS, count=1, cards=None) == (
        f"book: deep.gguf does not fit: {one}{INSTEAD}")


def test_book_refuses_a_model_that_fits_nowhere_naming_the_fullest_of_eight_cards(path, model):
    eight = overflow(place(model, SETTINGS, 8, **FULL))
    assert eight.startswith("card 6 of 8 needs ")  # the output layer's card, not the last
    assert refusal(for_booking, path, SETTINGS, FULL, count=None, cards=None) == (
        f"book: deep.gguf does not fit: {eight}; nothing smaller fits: use a smaller quantisation")


def test_serve_start_refuses_what_does_not_fit_unless_forced_and_says_which_in_the_audit(model):
    assert for_server(model, SETTINGS, BOUNDS, 2, force=False) == {
        "per_card_mib": [86, 70], "limit_mib": 90, "fits": True, "forced": False}
    assert for_server(model, SETTINGS, BOUNDS, 2, force=True)["forced"] is False  # nothing to force
    one = overflow(place(model, SETTINGS, 1, **BOUNDS))
    assert refusal(for_server, model, SETTINGS, BOUNDS, 1, force=False) == (
        f"serve start: deep.gguf does not fit: {one}{INSTEAD}")
    assert refusal(for_server, model, SETTINGS, BOUNDS, 1, force=False, command="serve plan").startswith(
        "serve plan: deep.gguf does not fit: ")
    assert for_server(model, SETTINGS, BOUNDS, 1, force=True) == {
        "per_card_mib": [114], "limit_mib": 90, "fits": False, "forced": True}


STORED = {"model": "/models/deep.gguf", "ctx": 8192, "parallel": 2, "cache_type_k": "q8_0", "cache_type_v": "q4_0",
          "flash_attn": False, "unified": True, "cards_planned": 2, "per_card_mib": [86, 70]}


def test_a_servers_settings_are_what_was_given_else_the_stored_request_else_the_defaults():
    assert settings_of(None) == Settings()
    assert settings_of({}, ctx=None, parallel=None) == Settings()
    # every field differs from its default, so a field read under the wrong name shows
    assert settings_of(STORED) == Settings(ctx=8192, parallel=2, cache_type_k="q8_0", cache_type_v="q4_0",
                                           flash_attn=False, unified=True)
    given = settings_of(STORED, ctx=1024, parallel=None, cache_type_k="f16", flash_attn=True, unified=False)
    assert given == Settings(ctx=1024, parallel=2, cache_type_k="f16", cache_type_v="q4_0", flash_attn=True,
                             unified=False)  # False and True given win over what was stored; None given does not
    assert settings_of(None, parallel=3, flash_attn=False) == Settings(parallel=3, flash_attn=False)


def test_a_stored_request_serves_the_same_settings_again(model):
    # every field differs from its default, so a field stored under another name than settings_of reads shows
    settings = Settings(ctx=8192, parallel=2, cache_type_k="q8_0", cache_type_v="bf16", flash_attn=False, unified=True)
    stored = request_record(place(model, settings, 2, **BOUNDS), model, settings)
    assert settings_of(stored) == settings
