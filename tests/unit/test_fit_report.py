"""app.fit.report's text and its edges: `board fit`'s table as a member reads it, the figures measured on a server
replacing the estimate, and the boundaries of what `alternatives` suggests. Each setup puts a case on each side of a
rule (a value of exactly 10 MiB, a total exactly at the limit, a slot count whose cache is smaller than one slot
fewer), so a nearly right rule gives a different answer."""

from __future__ import annotations

import os
import time
from dataclasses import replace

import pytest

from app.fit.estimate import CardUse, Placement, Settings, place
from app.fit.gguf_model import read_model
from app.fit.report import alternatives, fit, overflow, render, with_measured
from tests.fit import shapes

READY_AT = 1768478400  # 15 Jan 2026, 12:00 UTC


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    directory = tmp_path_factory.mktemp("fit-report")
    return {name: read_model(shapes.write_model(directory / f"{name}.gguf", name)) for name in ("tiny", "mid")}


def fullest(model, settings: Settings, cards: int = 1) -> float:
    """The fullest card's MiB without overhead: a limit set to it fits exactly."""
    return max(c.total_mib for c in place(model, settings, cards, card_mib=1, overhead_mib=0, max_fill=1.0).per_card)


def test_the_table_as_a_member_reads_it(models):
    model = models["mid"]  # 91 MiB of F16 weights over 4 layers: 1, 2 and 4 cards do not fit under 90 MiB, 8 do
    result = fit(model, Settings(ctx=1000, parallel=3, flash_attn=False), card_mib=100, overhead_mib=5.5, max_fill=0.9)
    # the fits column is 4 wide, so a row without the cards' list ends in spaces
    assert render(result) == f"""\
model    {model.path}
         llama, 4 layers, F16, 0.09 GiB
request  ctx 1,000, 3 slots (333 tokens each), KV cache f16/f16, flash attention off
total    weights 91 MiB (0.5 of it on the host), KV 12 MiB, compute 38 MiB

cards  MiB on the fullest card: weights + KV + compute + overhead = total      fits (limit 90)
    1       91 +     12 +     27 +  5.5 =     136   NO{'  '}
    2       68 +    9.0 +     42 +  5.5 =     125   NO    cards: 125 65
    4       45 +    6.0 +     42 +  5.5 =      99   NO    cards: 99 68 65 26
    8       23 +    3.0 +     37 +  5.5 =      68   yes   cards: 68 68 14 68 65 14 26 14

smallest fit: 8 cards
Needs all 8 cards: book the whole machine, and check that a smaller context or quantisation won't do."""


def test_one_slot_one_shared_cache_flash_attention_and_a_model_that_fits_nowhere(models):
    # tiny has no experts; the header names a mixture of experts' counts (only the text reads them)
    result = fit(models["tiny"], Settings(ctx=2048, parallel=1, unified=True), card_mib=1, overhead_mib=0,
                 max_fill=1.0)
    lines = render(result).splitlines()
    assert lines[1] == "         llama, 2 layers, F32, 0.00 GiB"
    assert lines[2] == "request  ctx 2,048, 1 slot (one shared cache), KV cache f16/f16, flash attention on"
    assert lines[-3:] == ["", "smallest fit: none", "Does not fit even on 8 cards: lower --ctx or --parallel, use a "
                          "q8_0 cache (--cache-type-k q8_0 --cache-type-v q8_0), or a smaller quantisation."]
    moe = replace(result, model=replace(result.model, n_expert=8, n_expert_used=2))
    assert render(moe).splitlines()[1] == "         llama, 2 layers, F32, 0.00 GiB, 8 experts (2 used)"
    two = render(fit(models["tiny"], Settings(ctx=2048, parallel=2))).splitlines()
    assert two[2] == "request  ctx 2,048, 2 slots (1,024 tokens each), KV cache f16/f16, flash attention on"
    assert two[-2] == "smallest fit: 1 card"


def test_figures_of_ten_mib_and_over_are_whole_and_under_ten_have_a_decimal():
    placement = Placement(cards=1, per_card=(CardUse(6.0, 4.0, 0.0, 0.0),), host_weights_mib=0.0,
                          host_compute_mib=0.0, fits=False, limit_mib=9.5)
    assert overflow(placement) == "card 0 of 1 needs 10 MiB, 0.5 MiB over the 9.5 MiB limit"


def test_a_card_count_not_estimated_is_none(models):
    assert fit(models["tiny"], Settings()).option(3) is None


SERVER = {"id": 7, "ready_at": READY_AT, "cards": [3, 4]}
LIMITS = {"card_mib": 1000, "overhead_mib": 500, "max_fill": 0.9}  # a limit of 900 MiB a card


def test_measured_figures_are_kept_as_logged_and_a_card_exactly_at_the_limit_fits(models):
    result = fit(models["mid"], Settings(ctx=4096, parallel=2), **LIMITS)
    # CUDA1 logged no output buffer; with the overhead, CUDA0 comes to exactly the limit
    devices = {"CUDA0": {"weights_mib": 350.0, "kv_mib": 40.0, "compute_mib": 9.5, "output_mib": 0.5},
               "CUDA1": {"weights_mib": 100.25, "kv_mib": 10.0, "compute_mib": 4.0},
               "CUDA_Host": {"weights_mib": 0.5, "compute_mib": 1.0}}
    measured = with_measured(result, {**SERVER, "measured": {"devices": devices}}, overhead_mib=500)
    two = measured.option(2)
    assert [c.as_dict() for c in two.per_card] == [
        {"weights_mib": 350.0, "kv_mib": 40.0, "compute_mib": 10.0, "overhead_mib": 500, "total_mib": 900.0},
        {"weights_mib": 100.2, "kv_mib": 10.0, "compute_mib": 4.0, "overhead_mib": 500, "total_mib": 614.2}]
    assert two.fits is True
    assert measured.as_json()["measured"] == {
        "server": 7, "ready_at": READY_AT, "cards": 2, "total_mib": 515.8,  # every device's buffers, the host's too
        "per_card": [c.as_dict() for c in two.per_card]}
    when = time.strftime("%d %b", time.localtime(READY_AT))
    assert render(measured).splitlines()[-5:-3] == [
        "", f"measured on this server on {when} (server 7): the 2-card row uses its figures"]
    over = {**devices, "CUDA1": {**devices["CUDA1"], "kv_mib": 300.0}}
    assert with_measured(result, {**SERVER, "measured": {"devices": over}}, overhead_mib=500).option(2).fits is False


def test_a_server_whose_cards_were_not_all_logged_keeps_the_estimate_and_counts_the_total(models):
    result = fit(models["mid"], Settings(ctx=4096, parallel=2), **LIMITS)
    devices = {"CUDA0": {"weights_mib": 12.345, "kv_mib": 0.5}, "CPU": {"compute_mib": 0.25}}
    for server in ({"id": 9, "cards": [3, 4]}, {"id": 9, "cards": []}):  # CUDA1 missing; a server on no card
        measured = with_measured(result, {**server, "measured": {"devices": devices}}, overhead_mib=500)
        assert measured.options == result.options
        assert measured.as_json()["measured"] == {"server": 9, "ready_at": None, "cards": len(server["cards"]),
                                                  "total_mib": 13.1, "per_card": None}
        assert render(measured) == render(result).replace(  # the estimate's text, and the measured total
            "\n\nsmallest fit", "\n\nmeasured on this server on ? (server 9): 13 MiB in all\n\nsmallest fit")


class TestAlternativesEdges:
    """mid on one card, with the limit set to one variant's exact total: the variants on either side of it."""

    @pytest.mark.parametrize(("ctx", "expected"), [
        (1024, []),  # halved to 512 and no further, even though 256 would fit
        (513, ["--ctx 256"]),  # over 512, so halved once more
    ])
    def test_the_context_is_halved_while_over_512(self, models, ctx, expected):
        model = models["mid"]
        limit = fullest(model, Settings(ctx=256))
        assert fullest(model, Settings(ctx=512)) > limit  # the setup: 512 does not fit, 256 does
        found = alternatives(model, Settings(ctx=ctx), 1, card_mib=limit, overhead_mib=0, max_fill=1.0)
        assert [f for f in found if f.startswith("--ctx")] == expected

    @pytest.mark.parametrize(("ctx", "parallel", "fitting", "expected"), [
        # 4 slots need fewer cells than 3 (4 x 1,024 against 3 x 1,536), so only fewer slots are fewer
        (4096, 3, {1: False, 2: True, 4: True}, "--parallel 2"),
        (2560, 4, {1: False, 2: True, 3: False}, "--parallel 2"),  # the most that fit, not every other count
        (1280, 2, {1: True}, "--parallel 1"),
    ])
    def test_the_most_slots_that_fit_below_the_request(self, models, ctx, parallel, fitting, expected):
        model = models["mid"]
        limit = fullest(model, Settings(ctx=ctx, parallel=int(expected.split()[1])))
        assert fullest(model, Settings(ctx=ctx, parallel=parallel)) > limit
        assert {p: fullest(model, Settings(ctx=ctx, parallel=p)) <= limit for p in fitting} == fitting
        found = alternatives(model, Settings(ctx=ctx, parallel=parallel), 1, card_mib=limit, overhead_mib=0,
                             max_fill=1.0)
        assert [f for f in found if f.startswith("--parallel")] == [expected]

    def test_a_cache_type_llama_cpp_refuses_for_the_model_is_not_suggested(self, models):
        model = models["tiny"]  # heads of 16: a q8_0 cache (blocks of 32) is refused with flash attention
        settings = Settings(ctx=32768)
        card = place(model, settings, 1, card_mib=1, overhead_mib=0, max_fill=1.0).per_card[0]
        limit = card.total_mib - card.kv_mib / 3  # a cache of half the size would fit, were it allowed
        found = alternatives(model, settings, 1, card_mib=limit, overhead_mib=0, max_fill=1.0)
        assert found and not any("q8_0" in f for f in found)


BOARD = ["llama-server", "-c", "4096", "-np", "2", "-fa", "on", "-ctk", "f16", "-ctv", "f16", "-lv", "4"]
ON = Settings(ctx=4096, parallel=2)


@pytest.mark.parametrize(("cmdline", "settings", "same"), [
    (BOARD, ON, True),
    (BOARD, replace(ON, cache_type_k="q8_0"), False),
    (BOARD, replace(ON, cache_type_v="q8_0"), False),
    (BOARD, replace(ON, unified=True), False),
    (BOARD[:9] + ["-ctv", "q8_0", "-kvu"], replace(ON, cache_type_v="q8_0", unified=True), True),
    (BOARD[:5] + ["-fa", "off", "-ctk", "q8_0", "-ctv", "bf16"],  # the last flag's value is the last word
     replace(ON, flash_attn=False, cache_type_k="q8_0", cache_type_v="bf16"), True),
    (BOARD[:5] + ["-fa", "off"], replace(ON, flash_attn=True), False),
    # no cache types named: llama.cpp's f16; no -fa: llama.cpp's "auto", which is neither on nor off
    (BOARD[:7], ON, True),
    (BOARD[:7], replace(ON, cache_type_k="q8_0"), False),
    (BOARD[:7], replace(ON, cache_type_v="q8_0"), False),
    (BOARD[:5] + ["-ctk", "f16"], ON, False),
    (BOARD[:5] + ["-ctk", "f16"], replace(ON, flash_attn=False), False),
    (BOARD[:7] + ["-ctv"], ON, True),  # a flag without a value (cut short) reads as not given
    (None, ON, False),
])
def test_which_server_ran_the_same_request(models, tmp_path, cmdline, settings, same):
    from app.fit.report import same_request

    link = tmp_path / "link.gguf"
    link.symlink_to(models["tiny"].path)  # the member names the model by a link; the server recorded the file
    model = replace(models["tiny"], path=str(link))
    server = {"model": os.path.realpath(models["tiny"].path), "ctx": 4096, "parallel": 2, "cmdline": cmdline}
    assert same_request(server, model, settings) is same


def test_the_json_document(models):
    """`board fit --json`: the totals of the one-card option (the host's share included), to one decimal, and only the
    rows shown. Each figure has a second decimal (0.41, 0.28, 1.18, 0.43, ...), so a rounding that keeps it shows."""
    model = models["tiny"]
    settings = Settings(ctx=300, parallel=3, cache_type_k="f32", cache_type_v="bf16")
    result = fit(model, settings, card_mib=100, overhead_mib=0.25, max_fill=0.9, cards=2)
    assert result.as_json() == {
        "model": model.path, "n_layer": 2, "ctx": 300, "parallel": 3, "cache_type_k": "f32", "cache_type_v": "bf16",
        "weights_mib": 0.4, "kv_mib": 0.3, "compute_mib": 1.2, "host_mib": 0.4,
        "options": [{"cards": 2, "fits": True, "per_card": [
            {"weights_mib": 0.3, "kv_mib": 0.3, "compute_mib": 1.5, "overhead_mib": 0.2, "total_mib": 2.3},
            {"weights_mib": 0.1, "kv_mib": 0.0, "compute_mib": 0.9, "overhead_mib": 0.2, "total_mib": 1.2}]}],
        "smallest_fit": 1,
    }


def test_fits_defaults_are_the_configs(models):
    from app.config import Config
    from app.fit.request import limits

    assert fit(models["tiny"], ON) == fit(models["tiny"], ON, **limits(Config()))


ADVICE = {
    1: "Fits on one card: book 1. Splitting a model that fits only adds transfers between cards.",
    2: "Fits on 2 cards (TP2): book 2. A model that fits on 2 gains nothing from 8; prefer TP2/TP4.",
    4: "Fits on 4 cards (TP4): book 4. A model that fits on 4 gains nothing from 8; prefer TP2/TP4.",
    8: "Needs all 8 cards: book the whole machine, and check that a smaller context or quantisation won't do.",
    None: "Does not fit even on 8 cards: lower --ctx or --parallel, use a q8_0 cache "
          "(--cache-type-k q8_0 --cache-type-v q8_0), or a smaller quantisation.",
}


@pytest.mark.parametrize("smallest", ADVICE)
def test_the_advice_for_each_smallest_fit(models, smallest):
    from app.fit.report import advice

    result = fit(models["tiny"], ON)
    options = tuple(replace(o, fits=smallest is not None and o.cards >= smallest) for o in result.options)
    assert advice(replace(result, options=options)) == ADVICE[smallest]
