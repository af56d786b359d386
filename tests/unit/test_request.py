"""A booking's request (app/core/request.py): each field on both sides of its range, and what readers take of a
stored row. The service's use of it, over both transports, is in tests/service/test_checked_input.py."""

from __future__ import annotations

import pytest

from app.core.request import CACHE_TYPES, MAX_MIB, check, readable
from app.errors import BadInput

CARD = {"weights_mib": 1.5, "kv_mib": 0.5, "compute_mib": 200.0, "overhead_mib": 500.0, "total_mib": 702.0}
GOOD = {"model": "/models/tiny.gguf", "ctx": 256, "parallel": 1, "cache_type_k": "f16", "cache_type_v": "q8_0",
        "flash_attn": True, "unified": False, "cards_planned": 2, "per_card_mib": [700, 702],
        "estimate": [CARD, CARD]}
WHOLE = "must be a whole number from"
PER_CARD = "per_card_mib must be a list of 1 to 64 whole MiB figures, one per card"
ESTIMATE = ("estimate must be a list of 1 to 64 cards, each {weights_mib, kv_mib, compute_mib, overhead_mib, total_mib}"
            " in MiB")


def refusal(request) -> str:
    with pytest.raises(BadInput) as refused:
        check(request)
    assert refused.value.exit_code == 2
    return str(refused.value)


@pytest.mark.parametrize("change", [
    {"ctx": 1}, {"ctx": 2**31 - 1}, {"parallel": 256},
    {"model": "x"}, {"model": "/" * 4096}, {"model": "/models/名前 with spaces.gguf"},
    {"cache_type_k": "iq4_nl", "cache_type_v": "f32"}, {"flash_attn": False, "unified": True},
    {"cards_planned": 1, "per_card_mib": [0], "estimate": [dict.fromkeys(CARD, 0)]},
    {"cards_planned": 64, "per_card_mib": [MAX_MIB] * 64, "estimate": [{**CARD, "total_mib": MAX_MIB}] * 64},
    {"estimate": [{**CARD, "kv_mib": 0}, {**CARD, "kv_mib": 3}]},  # whole numbers are figures too
])
def test_a_request_inside_every_range_is_taken_as_it_is(change):
    request = {**GOOD, **change}
    taken = check(request)
    assert taken == request and taken is not request
    assert readable(request) == request


def test_only_model_ctx_and_parallel_are_needed():
    assert check({"model": "m.gguf", "ctx": 4096, "parallel": 4}) == {"model": "m.gguf", "ctx": 4096, "parallel": 4}
    for key in ("model", "ctx", "parallel"):
        assert refusal({k: v for k, v in GOOD.items() if k != key}) == f"book: request needs {key!r}"


@pytest.mark.parametrize("change, message", [
    ({"ctx": 0}, f"ctx {WHOLE} 1 to 2147483647"),
    ({"ctx": 2**31}, f"ctx {WHOLE} 1 to 2147483647"),
    ({"ctx": "256"}, f"ctx {WHOLE} 1 to 2147483647"),
    ({"ctx": 256.0}, f"ctx {WHOLE} 1 to 2147483647"),
    ({"parallel": 0}, f"parallel {WHOLE} 1 to 256"),
    ({"parallel": 257}, f"parallel {WHOLE} 1 to 256"),
    ({"parallel": True}, f"parallel {WHOLE} 1 to 256"),
    ({"model": ""}, "model must be a file path of 1 to 4096 printable characters"),
    ({"model": "/" * 4097}, "model must be a file path of 1 to 4096 printable characters"),
    ({"model": "/m/\x1b[2J.gguf"}, "model must be a file path of 1 to 4096 printable characters"),
    ({"model": "/m/\u202e.gguf"}, "model must be a file path of 1 to 4096 printable characters"),
    ({"model": ["/m.gguf"]}, "model must be a file path of 1 to 4096 printable characters"),
    ({"cache_type_k": "q3_k"}, f"cache_type_k must be one of {', '.join(CACHE_TYPES)}"),
    ({"cache_type_v": ["f16"]}, f"cache_type_v must be one of {', '.join(CACHE_TYPES)}"),
    ({"flash_attn": 1}, "flash_attn must be true or false"),
    ({"unified": "no"}, "unified must be true or false"),
    ({"cards_planned": 0}, f"cards_planned {WHOLE} 1 to 64"),
    ({"cards_planned": 65}, f"cards_planned {WHOLE} 1 to 64"),
    ({"per_card_mib": []}, PER_CARD),
    ({"per_card_mib": [700] * 65}, PER_CARD),
    ({"per_card_mib": [700, -1]}, PER_CARD),
    ({"per_card_mib": [700, MAX_MIB + 1]}, PER_CARD),
    ({"per_card_mib": [700, 700.5]}, PER_CARD),
    ({"per_card_mib": [700, True]}, PER_CARD),
    ({"per_card_mib": "700"}, PER_CARD),
    ({"estimate": []}, ESTIMATE),
    ({"estimate": [CARD] * 65}, ESTIMATE),
    ({"estimate": [CARD, {k: v for k, v in CARD.items() if k != "kv_mib"}]}, ESTIMATE),
    ({"estimate": [CARD, {**CARD, "colour": 1}]}, ESTIMATE),
    ({"estimate": [CARD, {**CARD, "kv_mib": -0.1}]}, ESTIMATE),
    ({"estimate": [CARD, {**CARD, "kv_mib": MAX_MIB + 1}]}, ESTIMATE),
    ({"estimate": [CARD, {**CARD, "kv_mib": float("nan")}]}, ESTIMATE),
    ({"estimate": [CARD, {**CARD, "kv_mib": float("inf")}]}, ESTIMATE),
    ({"estimate": [CARD, {**CARD, "kv_mib": False}]}, ESTIMATE),
    ({"estimate": [CARD, "x"]}, ESTIMATE),
    ({"estimate": CARD}, ESTIMATE),
    ({"per_card_mib": [700]}, "per_card_mib has 1 cards, not cards_planned (2)"),
    ({"estimate": [CARD] * 3}, "estimate has 3 cards, not cards_planned (2)"),
])
def test_a_field_out_of_its_type_or_range_is_refused_in_one_line(change, message):
    assert refusal({**GOOD, **change}) == f"book: request {message}"


def test_unknown_keys_and_other_shapes_are_refused():
    assert refusal({**GOOD, "colour": "red"}) == (
        "book: request has an unknown key 'colour'; known: model, ctx, parallel, cache_type_k, cache_type_v, flash_attn,"
        " unified, cards_planned, per_card_mib, estimate")
    assert refusal({**GOOD, "x" * 60: 1}).startswith(f"book: request has an unknown key {'x' * 40!r}; known:")
    assert refusal([GOOD]) == "book: request must be an object"


def test_lengths_are_checked_against_cards_planned_only_when_it_is_given():
    request = {k: v for k, v in GOOD.items() if k != "cards_planned"}
    assert check({**request, "per_card_mib": [1, 2, 3]}) == {**request, "per_card_mib": [1, 2, 3]}


def test_readers_take_the_well_formed_fields_of_a_stored_row():
    stored = {"model": "/m/\x1b]0;x\x07.gguf", "ctx": "lots", "parallel": 2, "per_card_mib": [True], "colour": "red",
              "estimate": [CARD], "cache_type_k": "q8_0"}
    assert readable(stored) == {"parallel": 2, "estimate": [CARD], "cache_type_k": "q8_0"}
    for nothing in (None, [], "x", 7):
        assert readable(nothing) == {}
