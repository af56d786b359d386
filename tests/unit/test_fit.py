"""app.fit without llama-server: a model's shape from real GGUF files (tests/fit/shapes.py writes them), llama.cpp's
placement and KV rules, the refusals, the report's JSON and advice, and the graph allocator on graphs whose peak is
worked out by hand. The figures pinned from the real server were read from its `-lv 4` lines (tests/fit/runner.py,
this build of llama.cpp); tests/fit/test_accuracy.py runs the server itself.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest

from app.errors import BadInput
from app.fit import graph
from app.fit.estimate import MIB, Settings, cpu_totals, graph_shape, kv_bytes_per_layer, layer_cards, place
from app.fit.gguf_model import read_model
from app.fit.graph import Allocator, Graph, reserve
from app.fit.report import advice, alternatives, fit, overflow, render, request_record
from tests.fit import shapes

SMALL = ("tiny", "deep", "q4", "tied", "per-layer", "swa", "gqa8")


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    """model_file("tiny") -> the shape's GGUF, written once for this module."""
    directory = tmp_path_factory.mktemp("fit-shapes")
    written: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in written:
            written[name] = shapes.write_model(directory / f"{name}.gguf", name)
        return written[name]

    return get


def tensor_nbytes(rows: int, cols: int, dtype: str) -> int:
    import gguf

    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[dtype]]
    return max(rows, 1) * cols // block * size


def expected_bytes(shape: shapes.Shape) -> tuple[int, list[int], int]:
    """(input, per layer, output) bytes as llama.cpp groups the tensors, from what shapes.py writes."""
    layers = [0] * shape.n_layer
    inp = out = 0
    for name, rows, cols, dtype in shapes.tensors(shape):
        n = tensor_nbytes(rows, cols, dtype)
        if name.startswith("token_embd."):
            inp += n
        elif match := re.match(r"blk\.(\d+)\.", name):
            layers[int(match[1])] += n
        else:
            out += n
    return inp, layers, out


class TestReadModel:
    @pytest.mark.parametrize("name", SMALL)
    def test_weights_are_grouped_as_llama_cpp_places_them(self, model_file, name):
        shape = shapes.SHAPES[name]
        model = read_model(model_file(name))
        inp, layers, out = expected_bytes(shape)
        assert model.input_bytes == inp
        assert list(model.layer_bytes) == layers
        tied = shape.tied_output or shape.arch == "gemma2"
        assert model.tied_output is tied
        # a tied output loads a second copy of token_embd with the output layer
        assert model.output_bytes == out + (inp if tied else 0)
        assert model.tensor_bytes == inp + sum(layers) + out  # every tensor once: what a CPU server maps
        assert model.weights_bytes == model.tensor_bytes + (inp if tied else 0)

    @pytest.mark.parametrize("name", SMALL)
    def test_hyperparameters(self, model_file, name):
        shape = shapes.SHAPES[name]
        model = read_model(model_file(name))
        assert model.arch == shape.arch
        assert model.n_layer == shape.n_layer
        assert model.n_embd == shape.n_embd
        assert model.n_vocab == shape.n_vocab
        assert model.n_ctx_train == shape.context_length
        assert model.n_head == (shape.n_head,) * shape.n_layer
        assert model.n_head_kv == tuple(shape.heads_kv(il) for il in range(shape.n_layer))
        assert model.n_ff == tuple(shape.ff(il) for il in range(shape.n_layer))
        assert model.head_k == model.head_v == shape.head_size
        assert model.swa == tuple(shape.is_swa(il) for il in range(shape.n_layer))
        assert model.n_swa == (shape.sliding_window or 0)
        assert model.file_bytes == model_file(name).stat().st_size

    def test_per_layer_kv_heads_give_per_layer_cache_widths(self, model_file):
        model = read_model(model_file("per-layer"))
        assert model.n_head_kv == (4, 2, 1, 2)
        assert [model.n_embd_k_gqa(il) for il in range(4)] == [128, 64, 32, 64]
        assert [model.n_embd_v_gqa(il) for il in range(4)] == [128, 64, 32, 64]

    def test_key_length_beats_the_width_over_the_heads(self, model_file):
        model = read_model(model_file("gqa8"))  # 256 wide, 8 heads, but 128 per head
        assert (model.head_k, model.head_v, model.n_embd_k_gqa(0)) == (128, 128, 256)

    def test_the_commonest_large_tensor_type_names_the_weights(self, tmp_path):
        shape = shapes.Shape("q8-wide", n_embd=1024, n_layer=1, n_head=8, n_head_kv=8, n_ff=1024, dtype="Q8_0")
        assert read_model(shapes.write_model(tmp_path / "q8.gguf", shape)).weight_type == "Q8_0"

    def test_a_split_model_sums_to_the_single_file(self, model_file, tmp_path, monkeypatch):
        import gguf

        single = read_model(model_file("deep"))
        # gguf's own writer splits it, named as gguf-split names them: 40 tensors a file, so layer 4 straddles two
        monkeypatch.setattr(gguf, "GGUFWriter", functools.partial(gguf.GGUFWriter, split_max_tensors=40))
        shapes.write_model(tmp_path / "deep.gguf", "deep")
        files = sorted(tmp_path.glob("deep-*-of-00003.gguf"))
        assert [f.name for f in files] == [f"deep-{i:05d}-of-00003.gguf" for i in (1, 2, 3)]
        for given in files:  # any of the files names the whole model
            split = read_model(given)
            assert split.layer_bytes == single.layer_bytes
            assert (split.input_bytes, split.output_bytes, split.tensor_bytes) == (
                single.input_bytes, single.output_bytes, single.tensor_bytes)
            assert split.file_bytes == sum(f.stat().st_size for f in files)
            assert (split.n_layer, split.n_vocab, split.n_head_kv) == (single.n_layer, single.n_vocab, single.n_head_kv)

    def test_a_missing_split_file_is_named(self, tmp_path, monkeypatch):
        import gguf

        monkeypatch.setattr(gguf, "GGUFWriter", functools.partial(gguf.GGUFWriter, split_max_tensors=40))
        shapes.write_model(tmp_path / "deep.gguf", "deep")
        (tmp_path / "deep-00002-of-00003.gguf").unlink()
        with pytest.raises(BadInput, match="deep-00002-of-00003.gguf"):
            read_model(tmp_path / "deep-00001-of-00003.gguf")


class TestBadModels:
    """Each is a BadInput (the CLI's exit 2, one line), never another exception."""

    def check(self, path, *words: str) -> None:
        with pytest.raises(BadInput) as caught:
            read_model(path)
        message = str(caught.value)
        assert "\n" not in message
        for word in words:
            assert word in message

    def test_missing(self, tmp_path):
        self.check(tmp_path / "nope.gguf", "no model file", "nope.gguf")

    def test_directory(self, tmp_path):
        self.check(tmp_path, "is a directory")

    def test_text_file(self, tmp_path):
        (tmp_path / "notes.gguf").write_text("hello, not a model\n")
        self.check(tmp_path / "notes.gguf", "is not a GGUF file")

    def test_empty_file(self, tmp_path):
        (tmp_path / "empty.gguf").write_bytes(b"")
        self.check(tmp_path / "empty.gguf", "is not a GGUF file")

    @pytest.mark.parametrize("keep", [4, 24, 200, 3000, 20000])
    def test_truncated_gguf(self, model_file, tmp_path, keep):
        (tmp_path / "cut.gguf").write_bytes(model_file("tiny").read_bytes()[:keep])
        self.check(tmp_path / "cut.gguf", "cut.gguf")

    def test_unreadable(self, model_file, tmp_path):
        import os

        if os.geteuid() == 0:
            pytest.skip("root reads any file")
        path = tmp_path / "locked.gguf"
        path.write_bytes(model_file("tiny").read_bytes())
        path.chmod(0)
        self.check(path, "can't read", "locked.gguf")

    def test_unknown_architecture_is_named_not_guessed(self, tmp_path):
        path = shapes.write_model(tmp_path / "ssm.gguf", shapes.Shape("ssm", arch="mamba"))
        self.check(path, "'mamba'", "llama")


class TestLayerCards:
    def test_32_layers_over_two_cards(self):
        owners = layer_cards(32, [1, 1])
        assert len(owners) == 33  # the output layer is the last
        assert owners[:17] == [0] * 17  # il / 33 < 0.5 for il <= 16
        assert owners[17:] == [1] * 16

    @pytest.mark.parametrize("n_layer", [1, 7, 32, 48, 61, 80, 95])
    @pytest.mark.parametrize("cards", [1, 2, 4, 8])
    def test_an_even_split(self, n_layer, cards):
        # upper_bound(k / cards, il / (n_layer + 1)) is floor(il * cards / (n_layer + 1)) for an even split
        assert layer_cards(n_layer, [1.0] * cards) == [il * cards // (n_layer + 1) for il in range(n_layer + 1)]

    def test_32_layers_over_eight_cards_puts_the_output_on_the_last(self):
        owners = layer_cards(32, [1.0] * 8)
        assert [owners.count(c) for c in range(8)] == [5, 4, 4, 4, 4, 4, 4, 4]  # and the output with card 7's 3
        assert owners[-1] == 7

    def test_a_model_shallower_than_the_cards_leaves_some_empty(self):
        # 2 layers + output over 8 cards: il / 3 = 0, 0.33, 0.67 -> cards 0, 2, 5; the output is not on the last card
        assert layer_cards(2, [1.0] * 8) == [0, 2, 5]

    def test_an_uneven_split(self):
        # 7 layers + output, 3:1: points 0.75, 1.0; il / 8 < 0.75 for il <= 5
        assert layer_cards(7, [3, 1]) == [0] * 6 + [1] * 2
        assert layer_cards(7, [0.75, 0.25]) == [0] * 6 + [1] * 2

    def test_a_card_with_no_share_gets_nothing(self):
        owners = layer_cards(10, [1, 0, 1])
        assert 1 not in owners
        assert owners.count(0) + owners.count(2) == 11

    def test_the_split_is_summed_in_float32_as_llama_cpp_does(self):
        # float32 points 0.1, 0.3, 1.0; layer 3 of 9 + output sits at float32(3 / 10), which equals float32(0.3), so
        # upper_bound passes it to card 2 (in float64, 0.3 is below 0.1 + 0.2 and it would stay on card 1)
        assert layer_cards(9, [0.1, 0.2, 0.7]) == [0, 1, 1, 2, 2, 2, 2, 2, 2, 2]

    @pytest.mark.parametrize("split", [[0.1, 0.2, 0.7], [0.3, 0.3, 0.4], [0.15, 0.35, 0.5], [0.1] * 10, [0.9, 0.1],
                                       [2, 1, 1], [1 / 3] * 3, [5, 3, 0, 8], [0.7, 0.1, 0.1, 0.1], [0.3] * 8])
    def test_against_numpy_float32(self, split):
        import numpy as np

        points = np.cumsum(np.array(split, dtype=np.float32), dtype=np.float32)
        points = (points / points[-1]).astype(np.float32)
        for n_layer in range(1, 100):
            at = [np.float32(np.float32(il) / np.float32(n_layer + 1)) for il in range(n_layer + 1)]
            expected = [min(int(np.searchsorted(points, x, side="right")), len(split) - 1) for x in at]
            assert layer_cards(n_layer, split) == expected, n_layer


class TestKvCache:
    def test_the_cells_pad_to_256_per_stream(self):
        # ctx 1000 -> n_ctx 1024; 3 slots: 1024 // 3 = 341 -> 512 cells each, 3 streams
        assert Settings(ctx=1000, parallel=3).cells() == (3, 512)
        assert Settings(ctx=1000, parallel=3, unified=True).cells() == (1, 1024)
        assert Settings(ctx=4096, parallel=4).cells() == (4, 1024)
        assert Settings(ctx=100).cells() == (1, 256)
        # the padded context is divided, not the one asked for: 1024 // 3 = 341 -> 512 (769 // 3 = 256 would stay 256)
        assert Settings(ctx=769, parallel=3).cells() == (3, 512)

    def test_bytes_per_layer(self, model_file):
        tiny = read_model(model_file("tiny"))  # 2 KV heads of 16: K and V rows of 32 f16 = 64 bytes each
        assert kv_bytes_per_layer(tiny, Settings(ctx=1000, parallel=3)) == [3 * 512 * 128] * 2
        assert kv_bytes_per_layer(tiny, Settings(ctx=1000, parallel=3, unified=True)) == [1024 * 128] * 2

    def test_quantised_rows(self, model_file):
        gqa8 = read_model(model_file("gqa8"))  # rows of 256: q8_0 256 / 32 * 34 = 272, q4_0 256 / 32 * 18 = 144
        settings = Settings(ctx=4096, cache_type_k="q8_0", cache_type_v="q4_0")
        assert kv_bytes_per_layer(gqa8, settings) == [4096 * (272 + 144)] * 4
        assert kv_bytes_per_layer(gqa8, Settings(ctx=4096, cache_type_k="f32")) == [4096 * (1024 + 512)] * 4

    def test_per_layer_heads(self, model_file):
        model = read_model(model_file("per-layer"))
        assert kv_bytes_per_layer(model, Settings(ctx=2048)) == [2048 * 4 * w for w in (128, 64, 32, 64)]

    def test_without_flash_attention_v_rows_are_as_wide_as_the_widest_layers(self, model_file):
        # V is stored transposed; llama-server -fa off -c 2048 logs K 1.12 MiB, V 2.00 MiB for this model
        model = read_model(model_file("per-layer"))
        sizes = kv_bytes_per_layer(model, Settings(ctx=2048, flash_attn=False))
        assert sizes == [2048 * (2 * w + 2 * 128) for w in (128, 64, 32, 64)]
        assert sum(sizes) / MIB == pytest.approx(1.125 + 2.0)

    def test_sliding_window_layers_keep_the_window_plus_a_ubatch(self, model_file):
        swa = read_model(model_file("swa"))  # window 256 on layers 0 and 2; rows of 64 f16: 256 bytes a cell
        # full layers: 8192 cells; window layers: pad256(min(8192, 256 + 512)) = 768
        assert kv_bytes_per_layer(swa, Settings(ctx=8192)) == [768 * 256, 8192 * 256] * 2
        # unified over 4 slots, the window is per slot: pad256(256 * 4 + 512) = 1536
        assert kv_bytes_per_layer(swa, Settings(ctx=8192, parallel=4, unified=True)) == [1536 * 256, 8192 * 256] * 2
        # 4 streams of 2048 cells; each stream's window: 768
        assert kv_bytes_per_layer(swa, Settings(ctx=8192, parallel=4)) == [4 * 768 * 256, 4 * 2048 * 256] * 2
        # never more than the full cache
        assert kv_bytes_per_layer(swa, Settings(ctx=512)) == [512 * 256] * 4

    def test_the_window_cache_pads_to_256(self, tmp_path):
        shape = shapes.Shape("w100", arch="gemma2", n_embd=128, n_layer=2, n_head=4, n_head_kv=2, head_dim=32,
                             sliding_window=100, context_length=8192)
        model = read_model(shapes.write_model(tmp_path / "w100.gguf", shape))
        assert (model.swa, model.n_swa) == ((True, False), 100)
        # pad256(min(8192, 100 + 512)) = 768 cells, not 612
        assert kv_bytes_per_layer(model, Settings(ctx=8192)) == [768 * 256, 8192 * 256]

    def test_the_window_pattern_of_gemma3(self, tmp_path):
        # llama.cpp's set_swa_pattern(6): five window layers, then one full one
        shape = shapes.Shape("g3", arch="gemma3", n_embd=128, n_layer=8, n_head=4, n_head_kv=2, head_dim=32,
                             sliding_window=512)
        model = read_model(shapes.write_model(tmp_path / "g3.gguf", shape))
        assert model.swa == (True, True, True, True, True, False, True, True)


class TestRefusals:
    def test_a_quantised_v_cache_needs_flash_attention(self, model_file):
        gqa8 = read_model(model_file("gqa8"))
        with pytest.raises(BadInput, match="flash attention"):
            Settings(cache_type_v="q8_0", flash_attn=False).check(gqa8)
        Settings(cache_type_v="q8_0", flash_attn=True).check(gqa8)
        Settings(cache_type_k="q8_0", flash_attn=False).check(gqa8)  # a quantised K alone is fine

    def test_a_head_size_the_block_does_not_divide(self, model_file):
        tiny = read_model(model_file("tiny"))  # heads of 16
        with pytest.raises(BadInput) as caught:
            Settings(cache_type_k="q4_0", flash_attn=True).check(tiny)
        assert "32" in str(caught.value) and "16" in str(caught.value)
        with pytest.raises(BadInput, match="cache-type-v"):
            Settings(cache_type_v="q8_0", flash_attn=True).check(tiny)
        # without flash attention llama.cpp only needs the whole row (2 heads of 16 = 32) to be whole blocks
        Settings(cache_type_k="q4_0", flash_attn=False).check(tiny)

    def test_a_row_the_block_does_not_divide(self, tmp_path):
        odd = shapes.write_model(tmp_path / "odd.gguf", shapes.Shape("odd", n_embd=48, n_head=4, n_head_kv=1))
        with pytest.raises(BadInput, match="multiple of 32"):  # one head of 12: rows of 12
            Settings(cache_type_k="q8_0", flash_attn=False).check(read_model(odd))

    @pytest.mark.parametrize("settings", [Settings(ctx=0), Settings(parallel=0), Settings(cache_type_k="q3_k"),
                                          Settings(cache_type_v="f64")])
    def test_impossible_settings(self, model_file, settings):
        with pytest.raises(BadInput):
            settings.check(read_model(model_file("tiny")))

    def test_each_refusal_in_full(self, model_file, tmp_path):
        """The line a member reads (exit 2), each refusal's own."""
        tiny, gqa8 = read_model(model_file("tiny")), read_model(model_file("gqa8"))
        odd = read_model(shapes.write_model(tmp_path / "odd.gguf", shapes.Shape("odd", n_embd=48, n_head=4, n_head_kv=1)))
        types = "f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl"
        for settings, model, message in [
            (Settings(ctx=0), tiny, "--ctx must be at least 1 token, not 0"),
            (Settings(parallel=0), tiny, "--parallel must be at least 1, not 0"),
            (Settings(parallel=257), tiny, "--parallel must be at most 256 (llama.cpp's limit), not 257"),
            (Settings(cache_type_k="q3_k"), tiny, f"--cache-type-k 'q3_k' is not a cache type; use one of {types}"),
            (Settings(cache_type_v="f64"), tiny, f"--cache-type-v 'f64' is not a cache type; use one of {types}"),
            (Settings(cache_type_k="q4_0"), tiny, "--cache-type-k q4_0 with flash attention needs a head size that is "
                                                  "a multiple of 32; this model's is 16 (llama.cpp refuses it)"),
            (Settings(cache_type_v="q8_0"), tiny, "--cache-type-v q8_0 with flash attention needs a head size that is "
                                                  "a multiple of 32; this model's is 16 (llama.cpp refuses it)"),
            (Settings(cache_type_k="q8_0", flash_attn=False), odd,
             "--cache-type-k q8_0 needs K/V rows that are a multiple of 32 wide; this model's are 12"),
            (Settings(cache_type_v="q8_0", flash_attn=False), gqa8,
             "a q8_0 V cache needs flash attention (--flash-attn on), as llama.cpp requires"),
        ]:
            with pytest.raises(BadInput) as caught:
                settings.check(model)
            assert str(caught.value) == message

    def test_the_bounds_themselves_are_allowed(self, model_file):
        tiny = read_model(model_file("tiny"))
        Settings(ctx=1).check(tiny)
        Settings(parallel=256).check(tiny)  # llama.cpp's LLAMA_MAX_SEQ

    def test_k_and_v_are_checked_against_their_own_head_size(self, model_file):
        from dataclasses import replace

        # K heads of 128, V heads of 80 (models with other V heads than K heads exist: MLA's 192 and 128)
        model = replace(read_model(model_file("gqa8")), head_v=80)
        Settings(cache_type_k="q8_0").check(model)
        with pytest.raises(BadInput, match="^--cache-type-v q8_0 with flash attention .* this model's is 80 "):
            Settings(cache_type_v="q8_0").check(model)

    def test_place_refuses_what_llama_cpp_refuses(self, model_file):
        with pytest.raises(BadInput):
            place(read_model(model_file("gqa8")), Settings(cache_type_v="q8_0", flash_attn=False), 1,
                  card_mib=32607, overhead_mib=500, max_fill=0.9)


LIMITS = {"card_mib": 32607, "overhead_mib": 500.0, "max_fill": 0.9}


class TestPlace:
    def test_weights_and_kv_follow_the_layers(self, model_file):
        model = read_model(model_file("deep"))  # 12 layers: 0-6 on card 0, 7-11 and the output on card 1
        settings = Settings(ctx=4096, parallel=2)
        placement = place(model, settings, 2, **LIMITS)
        kv = kv_bytes_per_layer(model, settings)
        first, second = placement.per_card
        assert first.weights_mib * MIB == sum(model.layer_bytes[:7])
        assert second.weights_mib * MIB == sum(model.layer_bytes[7:]) + model.output_bytes
        assert first.kv_mib * MIB == sum(kv[:7])
        assert second.kv_mib * MIB == sum(kv[7:])
        assert placement.host_weights_mib * MIB == model.input_bytes
        assert first.overhead_mib == second.overhead_mib == 500.0
        assert first.total_mib == first.weights_mib + first.kv_mib + first.compute_mib + 500.0

    def test_on_more_cards_than_layers_the_output_layer_is_not_on_the_last_card(self, model_file):
        model = read_model(model_file("tiny"))  # 2 layers and the output over 8 cards: cards 0, 2 and 5
        settings = Settings()
        per_card = place(model, settings, 8, **LIMITS).per_card
        layer_0, layer_1 = model.layer_bytes
        assert [c.weights_mib * MIB for c in per_card] == [layer_0, 0, layer_1, 0, 0, model.output_bytes, 0, 0]
        kv_0, kv_1 = kv_bytes_per_layer(model, settings)
        assert [c.kv_mib * MIB for c in per_card] == [kv_0, 0, kv_1, 0, 0, 0, 0, 0]
        # The logits are computed on card 5; a card with no layer holds only the residual stream it passes on.
        idle = {per_card[i].compute_mib for i in (1, 3, 4, 6, 7)}
        assert len(idle) == 1 and per_card[5].compute_mib > max(idle)

    def test_one_card_holds_everything_but_the_input_layer(self, model_file):
        model = read_model(model_file("tied"))
        (card,) = place(model, Settings(), 1, **LIMITS).per_card
        assert card.weights_mib * MIB == model.weights_bytes - model.input_bytes
        assert card.kv_mib * MIB == sum(kv_bytes_per_layer(model, Settings()))
        assert card.compute_mib > 0

    def test_fits_is_at_or_under_the_fill_limit(self, model_file):
        model = read_model(model_file("tiny"))
        total = place(model, Settings(), 1, card_mib=1000, overhead_mib=0, max_fill=1.0).per_card[0].total_mib
        assert place(model, Settings(), 1, card_mib=total, overhead_mib=0, max_fill=1.0).fits
        assert not place(model, Settings(), 1, card_mib=total * 0.999, overhead_mib=0, max_fill=1.0).fits
        assert place(model, Settings(), 1, card_mib=total / 0.5, overhead_mib=0, max_fill=0.5).fits
        assert not place(model, Settings(), 1, card_mib=total / 0.5, overhead_mib=0, max_fill=0.499).fits
        assert place(model, Settings(), 1, card_mib=1000, overhead_mib=0, max_fill=0.9).limit_mib == 900

    def test_the_overhead_counts_on_every_card(self, model_file):
        model = read_model(model_file("tiny"))
        placement = place(model, Settings(), 8, card_mib=1000, overhead_mib=123.0, max_fill=0.9)
        assert [c.overhead_mib for c in placement.per_card] == [123.0] * 8
        assert all(c.total_mib >= 123.0 for c in placement.per_card)


# llama-server's own figures (MiB, its -lv 4 lines, this build, CPU): model buffer, KV buffer, compute buffer.
MEASURED = [
    ("tiny", Settings(ctx=4096, flash_attn=True), 0.41, 1.00, 5.14),
    ("tiny", Settings(ctx=4096, flash_attn=False), 0.41, 1.00, 40.89),
    ("tiny", Settings(ctx=1000, parallel=3), 0.41, 0.38, 1.65),
    ("tiny", Settings(ctx=1000, parallel=3, unified=True), 0.41, 0.25, 2.15),
    ("gqa8", Settings(ctx=8192, parallel=4, cache_type_k="q8_0", cache_type_v="q8_0"), 8.26, 17.00, 8.60),
    ("swa", Settings(ctx=8192, parallel=2, flash_attn=False), 2.39, 4.75, 43.52),
    ("per-layer", Settings(ctx=2048, parallel=3, unified=True), 2.54, 2.25, 4.78),
    ("tied", Settings(ctx=4096), 1.28, 1.00, 5.14),
    # Under 512 tokens llama.cpp's ubatch is the context as given (n_batch = min(n_ctx, -b) before n_ctx is padded to
    # 256), so the graph has ctx tokens, not 256 (which gave 0.70 and 3.78 MiB).
    ("tiny", Settings(ctx=100), 0.41, 0.06, 0.27),
    ("swa", Settings(ctx=300), 2.39, 0.50, 2.21),
]


@pytest.mark.parametrize(("name", "settings", "weights", "kv", "compute"), MEASURED)
def test_cpu_totals_match_llama_server(model_file, name, settings, weights, kv, compute):
    totals = cpu_totals(read_model(model_file(name)), settings)
    assert totals["weights_mib"] == pytest.approx(weights, abs=0.006)  # the log prints two decimals
    assert totals["kv_mib"] == pytest.approx(kv, abs=0.006)
    assert totals["compute_mib"] == pytest.approx(compute, rel=0.01, abs=0.006)


def test_the_graph_takes_the_context_as_given_under_a_ubatch(model_file):
    model = read_model(model_file("tiny"))
    assert graph_shape(model, Settings(ctx=4096)).n_tokens == 512
    assert graph_shape(model, Settings(ctx=4096, parallel=3)).n_outputs == 3


def test_the_graph_shape_of_a_windowed_model(model_file):
    model = read_model(model_file("swa"))  # window 256 on layers 0 and 2, heads of 32
    common = {"n_embd": 128, "n_vocab": model.n_vocab, "n_head": (4,) * 4, "n_head_kv": (2,) * 4, "n_ff": (256,) * 4,
              "head_k": 32, "head_v": 32, "swa": (True, False, True, False), "n_expert": 0, "n_expert_used": 0,
              "rot_k": 0, "rot_v": 0}
    # 3 slots unified: one stream of 5,120 cells; the window is per slot: pad256(256 x 3 + 512) = 1,280
    assert graph_shape(model, Settings(ctx=5000, parallel=3, unified=True)) == graph.Shape(
        **common, n_tokens=512, n_outputs=3, n_kv=5120, n_kv_swa=1280, n_stream=1, flash_attn=True)
    # 3 streams of pad256(5,120 // 3) = 1,792 cells, each with its own window: pad256(256 + 512) = 768
    assert graph_shape(model, Settings(ctx=5000, parallel=3, flash_attn=False)) == graph.Shape(
        **common, n_tokens=512, n_outputs=3, n_kv=1792, n_kv_swa=768, n_stream=3, flash_attn=False)


@pytest.mark.parametrize(("name", "types", "rotation"), [
    ("gqa8", ("q8_0", "q8_0"), (128, 64)),  # heads of 128: K's block grows to the head, V's stays at 64
    ("gqa8", ("f16", "q4_0"), (0, 64)),  # only a quantised cache is rotated
    ("gqa8", ("q4_0", "f16"), (128, 0)),
    ("q4", ("q8_0", "q8_0"), (64, 64)),  # heads of 64
    ("swa", ("q8_0", "q8_0"), (0, 0)),  # heads of 32: not a multiple of 64
])
def test_a_quantised_caches_rotation_block(model_file, name, types, rotation):
    shape = graph_shape(read_model(model_file(name)), Settings(cache_type_k=types[0], cache_type_v=types[1]))
    assert (shape.rot_k, shape.rot_v) == rotation


class TestReport:
    KEYS = {"model", "n_layer", "ctx", "parallel", "cache_type_k", "cache_type_v", "weights_mib", "kv_mib",
            "compute_mib", "host_mib", "options", "smallest_fit"}
    CARD_KEYS = {"weights_mib", "kv_mib", "compute_mib", "overhead_mib", "total_mib"}

    def test_json_has_exactly_the_issues_shape(self, model_file):
        path = model_file("deep")
        settings = Settings(ctx=8192, parallel=2, cache_type_k="q8_0", cache_type_v="q8_0")
        document = fit(read_model(path), settings).as_json()
        assert set(document) == self.KEYS
        assert (document["model"], document["n_layer"], document["ctx"], document["parallel"]) == (str(path), 12, 8192, 2)
        assert (document["cache_type_k"], document["cache_type_v"]) == ("q8_0", "q8_0")
        assert [o["cards"] for o in document["options"]] == [1, 2, 4, 8]
        for option in document["options"]:
            assert set(option) == {"cards", "per_card", "fits"}
            assert option["fits"] is True
            assert len(option["per_card"]) == option["cards"]
            for card in option["per_card"]:
                assert set(card) == self.CARD_KEYS
                assert card["total_mib"] == pytest.approx(
                    card["weights_mib"] + card["kv_mib"] + card["compute_mib"] + card["overhead_mib"], abs=0.25)
        assert document["smallest_fit"] == 1

    def test_top_level_figures_are_totals_host_included(self, model_file):
        model = read_model(model_file("tied"))
        settings = Settings(ctx=4096, parallel=2)
        result = fit(model, settings)
        document = result.as_json()
        one = result.option(1)
        assert document["weights_mib"] == round(model.weights_bytes / MIB, 1)
        assert document["kv_mib"] == round(sum(kv_bytes_per_layer(model, settings)) / MIB, 1)
        assert document["compute_mib"] == round(one.per_card[0].compute_mib + one.host_compute_mib, 1)
        assert document["host_mib"] == round(one.host_weights_mib + one.host_compute_mib, 1)
        for option in result.options:  # every option places the same weights and cache
            assert sum(c.weights_mib for c in option.per_card) + option.host_weights_mib == pytest.approx(
                model.weights_bytes / MIB)
            assert sum(c.kv_mib for c in option.per_card) == pytest.approx(document["kv_mib"], abs=0.05)

    def test_nothing_fits(self, model_file):
        result = fit(read_model(model_file("mid")), Settings(), card_mib=20, overhead_mib=0, max_fill=1.0)
        assert result.smallest_fit is None
        assert result.as_json()["smallest_fit"] is None
        assert [o["fits"] for o in result.as_json()["options"]] == [False] * 4
        assert advice(result).startswith("Does not fit even on 8 cards")

    def test_the_smallest_group_that_fits(self, model_file):
        model = read_model(model_file("mid"))
        settings = Settings(ctx=32768, parallel=4)
        totals = {n: max(c.total_mib for c in place(model, settings, n, card_mib=1, overhead_mib=0,
                                                      max_fill=1).per_card) for n in (1, 2, 4, 8)}
        assert totals[1] > totals[2] > totals[4]  # so a card between them makes 2 or 4 the smallest fit
        for n in (1, 2, 4):
            result = fit(model, settings, card_mib=totals[n], overhead_mib=0, max_fill=1.0)
            assert result.smallest_fit == n
            assert [o.fits for o in result.options][:[1, 2, 4].index(n) + 1][-1] is True
            assert not any(o.fits for o in result.options if o.cards < n)
        assert "book 1" in advice(fit(model, settings, card_mib=totals[1], overhead_mib=0, max_fill=1.0))
        assert "TP2" in advice(fit(model, settings, card_mib=totals[2], overhead_mib=0, max_fill=1.0))
        assert "TP4" in advice(fit(model, settings, card_mib=totals[4], overhead_mib=0, max_fill=1.0))

    def test_one_count_only_shows_one_row_but_searches_every_count(self, model_file):
        result = fit(read_model(model_file("tiny")), Settings(), cards=2)
        assert [o["cards"] for o in result.as_json()["options"]] == [2]
        assert result.smallest_fit == result.as_json()["smallest_fit"] == 1  # not "2": one card fits
        assert "smallest fit: 1 card\n" in render(result) + "\n"

    def test_one_count_that_does_not_fit_still_names_the_smallest_that_does(self, model_file):
        # mid at ctx 512: about 118 MiB on one card, 101 MiB on the fuller of two
        result = fit(read_model(model_file("mid")), Settings(ctx=512), card_mib=110, overhead_mib=0, max_fill=1.0,
                     cards=1)
        assert [(o["cards"], o["fits"]) for o in result.as_json()["options"]] == [(1, False)]
        text = render(result)
        assert [line.split()[0] for line in text.splitlines() if line[:5].strip().isdigit()] == ["1"]
        assert "smallest fit: 2 cards" in text and "none" not in text
        assert "Fits on 2 cards (TP2): book 2." in text and "even on 8" not in text

    def test_overflow_names_the_fullest_card_and_by_how_much(self, model_file):
        model = read_model(model_file("mid"))
        placement = place(model, Settings(ctx=32768, parallel=4), 2, card_mib=300, overhead_mib=0, max_fill=1.0)
        worst = max(range(2), key=lambda c: placement.per_card[c].total_mib)
        over = placement.per_card[worst].total_mib - 300
        assert over > 10
        assert overflow(placement) == (f"card {worst} of 2 needs {placement.per_card[worst].total_mib:,.0f} MiB, "
                                       f"{over:,.0f} MiB over the 300 MiB limit")

    def test_request_record(self, model_file):
        model = read_model(model_file("tiny"))
        settings = Settings(ctx=2048, parallel=2)
        placement = place(model, settings, 2, **LIMITS)
        record = request_record(placement, model, settings)
        assert record["model"] == str(model_file("tiny"))
        assert (record["ctx"], record["parallel"], record["cards_planned"]) == (2048, 2, 2)
        assert record["per_card_mib"] == [round(c.total_mib) for c in placement.per_card]
        assert record["estimate"] == [c.as_dict() for c in placement.per_card]


class TestAlternatives:
    """For a request that does not fit: each suggestion, applied as written, fits; a kind not suggested would not
    have fitted."""

    LIMITS = {"card_mib": 300, "overhead_mib": 0, "max_fill": 1.0}
    FLAGS = {"--ctx": ("ctx", int), "--parallel": ("parallel", int), "--cache-type-k": ("cache_type_k", str),
             "--cache-type-v": ("cache_type_v", str), "--flash-attn": ("flash_attn", {"on": True, "off": False}.get)}

    def fits(self, model, settings, cards) -> bool:
        try:
            return place(model, settings, cards, **self.LIMITS).fits
        except BadInput:  # llama.cpp would refuse it
            return False

    def apply(self, text: str, settings: Settings, cards: int) -> tuple[Settings, int]:
        from dataclasses import replace

        if match := re.fullmatch(r"(\d+) cards", text):
            return settings, int(match[1])
        words = text.split()
        assert len(words) % 2 == 0 and words, text
        changes = {}
        for flag, value in zip(words[::2], words[1::2]):
            name, parse = self.FLAGS[flag]
            changes[name] = parse(value)
        return replace(settings, **changes), cards

    @pytest.mark.parametrize(("settings", "cards"), [
        (Settings(ctx=32768, parallel=4), 1),
        (Settings(ctx=32768, parallel=4), 2),
        (Settings(ctx=65536, parallel=2, flash_attn=False), 1),
        (Settings(ctx=16384, parallel=128), 1),
        (Settings(ctx=4096, parallel=100), 1),
        (Settings(ctx=32768, parallel=4, flash_attn=False), 1),  # the q8_0 suggestion must add --flash-attn on
    ])
    def test_every_suggestion_fits(self, model_file, settings, cards):
        from dataclasses import replace

        model = read_model(model_file("mid"))  # about 91 MiB of weights
        assert not self.fits(model, settings, cards)
        found = alternatives(model, settings, cards, **self.LIMITS)
        assert found
        kinds = set()
        for text in found:
            changed, n = self.apply(text, settings, cards)
            assert self.fits(model, changed, n), text
            if n != cards:
                assert n > cards
                assert not any(self.fits(model, settings, m) for m in (2, 4, 8) if cards < m < n)  # the fewest
                kinds.add("cards")
            elif changed.ctx != settings.ctx:
                assert changed.ctx < settings.ctx
                assert not self.fits(model, replace(settings, ctx=changed.ctx * 2), cards)  # the largest halving
                kinds.add("ctx")
            elif changed.parallel != settings.parallel:
                assert changed.parallel < settings.parallel
                assert not any(self.fits(model, replace(settings, parallel=p), cards)
                               for p in range(changed.parallel + 1, settings.parallel))  # the most slots that fit
                kinds.add("parallel")
            else:
                assert (changed.cache_type_k, changed.cache_type_v) == ("q8_0", "q8_0"), text
                kinds.add("q8_0")
        if "ctx" not in kinds:
            assert not any(self.fits(model, replace(settings, ctx=c), cards) for c in (settings.ctx // 2, 1024, 512))
        if "parallel" not in kinds:
            assert not any(self.fits(model, replace(settings, parallel=p), cards) for p in range(1, settings.parallel))
        if "q8_0" not in kinds:
            assert not self.fits(model, replace(settings, cache_type_k="q8_0", cache_type_v="q8_0", flash_attn=True), cards)
        if "cards" not in kinds:
            assert not any(self.fits(model, settings, n) for n in (2, 4, 8) if n > cards)

    def test_the_known_answer(self, model_file):
        found = alternatives(read_model(model_file("mid")), Settings(ctx=32768, parallel=4), 1, **self.LIMITS)
        assert found == ["--ctx 16384", "--cache-type-k q8_0 --cache-type-v q8_0", "4 cards"]

    def test_nothing_helps(self, model_file):
        model = read_model(model_file("mid"))
        assert alternatives(model, Settings(ctx=32768, parallel=4), 1, card_mib=20, overhead_mib=0, max_fill=1.0) == []


class TestAllocator:
    """ggml_dyn_tallocr: best fit among the free blocks before the last, then the last; freed blocks merge."""

    def test_best_fit_takes_the_smallest_hole_that_fits(self):
        a = Allocator(32)
        assert [a.alloc(n) for n in (96, 32, 64, 32)] == [0, 96, 128, 192]
        a.release(0, 96)
        a.release(128, 64)
        assert a.alloc(64) == 128  # the 64 hole, not the first (96) one
        assert a.alloc(96) == 0  # so the 96 still fits in its hole
        assert a.high == 224

    def test_of_equal_holes_the_later_one(self):
        a = Allocator(32)
        assert [a.alloc(n) for n in (64, 32, 64, 32)] == [0, 64, 96, 160]
        a.release(0, 64)
        a.release(96, 64)
        assert a.alloc(64) == 96  # ggml keeps a block <= the best so far

    def test_the_end_grows_only_when_no_hole_fits(self):
        a = Allocator(32)
        a.alloc(32)
        a.alloc(32)
        a.release(0, 32)
        assert a.alloc(64) == 64
        assert a.high == 128
        assert a.alloc(32) == 0

    def test_sizes_are_padded_to_the_alignment(self):
        a = Allocator(32)
        assert [a.alloc(1), a.alloc(33), a.alloc(32)] == [0, 32, 96]
        a.release(32, 33)
        assert a.alloc(64) == 32
        assert reserve(_chain(1), 128) == 256  # x and a, one byte each, in blocks of 128

    def test_a_freed_block_merges_with_the_one_below(self):
        a = Allocator(32)
        [a.alloc(n) for n in (64, 64, 32)]
        a.release(0, 64)
        a.release(64, 64)
        assert a.alloc(128) == 0
        assert a.high == 160

    def test_a_freed_block_merges_with_the_one_above(self):
        a = Allocator(32)
        [a.alloc(n) for n in (64, 64, 32)]
        a.release(64, 64)
        a.release(0, 64)
        assert a.alloc(128) == 0
        assert a.high == 160

    def test_a_freed_block_joins_both_neighbours(self):
        a = Allocator(32)
        [a.alloc(n) for n in (64, 64, 64, 32)]
        a.release(0, 64)
        a.release(128, 64)
        a.release(64, 64)
        assert a.alloc(192) == 0
        assert a.high == 224

    def test_the_top_block_freed_returns_to_the_end(self):
        a = Allocator(32)
        [a.alloc(n) for n in (64, 64)]
        a.release(64, 64)
        assert a.alloc(128) == 64  # from the end at 64, not past a stranded hole
        assert a.high == 192


def _chain(size: int) -> Graph:
    g = Graph()
    g.input("x", size)
    g.add("a", size, "x")
    return g


class TestReserve:
    """ggml_gallocr over hand-made graphs (alignment 32, sizes in blocks of 32): the peak worked out by hand."""

    def test_in_place_on_the_last_reader(self):
        g = Graph()
        g.input("x", 64)
        g.add("a", 64, "x", inplace=True)
        g.add("b", 64, "a", inplace=True)
        assert reserve(g, 32) == 64

    def test_not_in_place_when_the_parent_is_read_later(self):
        g = Graph()
        g.input("x", 64)
        g.add("a", 64, "x", inplace=True)  # x is still read by b: a gets its own block
        g.add("b", 64, "x", "a")
        assert reserve(g, 32) == 192

    def test_not_in_place_on_an_output(self):
        g = Graph()
        g.add("p", 64, output=True)
        g.add("a", 64, "p", inplace=True)
        assert reserve(g, 32) == 128

    def test_not_in_place_on_another_size(self):
        g = Graph()
        g.input("x", 64)
        g.add("a", 32, "x", inplace=True)
        assert reserve(g, 32) == 96

    def test_an_op_that_cannot_work_in_place_gets_a_block(self):
        g = Graph()
        g.input("x", 64)
        g.add("a", 64, "x")
        assert reserve(g, 32) == 128

    def test_a_parent_is_freed_after_its_last_reader_is_allocated(self):
        g = Graph()
        g.input("x", 64)
        g.add("a", 64, "x")  # x freed after a is placed: b reuses x's block
        g.add("b", 64, "a")
        assert reserve(g, 32) == 128

    def test_a_parent_lives_until_its_last_reader(self):
        g = Graph()
        g.input("x", 64)
        g.add("a", 64, "x")
        g.add("b", 64, "a")
        g.add("c", 64, "x", "b")  # x is held to here
        assert reserve(g, 32) == 192

    def test_a_source_read_twice_by_one_node_is_freed(self):
        g = Graph()
        g.input("x", 64)
        g.add("sq", 64, "x", "x")
        g.add("b", 64, "sq")  # into x's freed block
        assert reserve(g, 32) == 128

    def test_an_output_is_never_freed(self):
        g = Graph()
        g.input("x", 64)
        g.add("a", 64, "x", output=True)
        g.add("b", 64, "a")
        g.add("c", 64, "b")
        assert reserve(g, 32) == 192

    def test_inputs_are_placed_before_any_node(self):
        g = Graph()
        g.add("n1", 128)
        g.add("n2", 64, "n1")
        g.input("late", 128)  # placed first all the same: n1 cannot take its block
        g.add("n3", 64, "n2", "late")
        assert reserve(g, 32) == 320

    def test_weights_and_views_allocate_nothing(self):
        g = Graph()
        g.input("x", 64)
        g.add("mm", 64, "x", "weight")  # a source that is not a node lives in another buffer
        g.add("store", 0, "mm", "cache")
        assert reserve(g, 32) == 128


def test_the_logits_are_in_the_compute_buffer(model_file):
    from dataclasses import replace

    shape = graph_shape(read_model(model_file("tiny")), Settings(ctx=4096, parallel=4))
    assert shape.n_outputs == 4
    # a vocabulary of a million: the 4 output rows of logits (16 MB) dwarf the rest, and all of them are there
    (compute,), _ = graph.compute_bytes(replace(shape, n_vocab=1_000_000), [[0, 1]], 0, gpu=False)
    (small,), _ = graph.compute_bytes(shape, [[0, 1]], 0, gpu=False)
    assert 4 * 1_000_000 * 4 <= compute <= 4 * 1_000_000 * 4 + small


def test_a_cpu_server_computes_the_logits_on_its_one_device(model_file):
    # a vocabulary of 100,000 and 64 slots: 64 rows of logits (24 MiB) in the one compute buffer
    totals = cpu_totals(read_model(model_file("wide-vocab")), Settings(ctx=8192, parallel=64))
    assert totals["compute_mib"] >= 64 * 100_000 * 4 / MIB


def test_the_header_is_read_without_gguf_reader_and_big_arrays_are_only_counted(tmp_path, monkeypatch):
    """GGUFReader builds a numpy view per array element (seconds for a real vocabulary): board must not use it."""
    import gguf

    from app.fit.gguf_header import Counted, read_header

    path = shapes.write_model(tmp_path / "wide.gguf", "wide-vocab")
    monkeypatch.setattr(gguf, "GGUFReader", None)
    fields, tensors = read_header(path)
    assert fields["tokenizer.ggml.tokens"] == Counted(100_000)
    assert fields["tokenizer.ggml.scores"] == Counted(100_000)
    assert read_model(path).n_vocab == 100_000
    assert sum(t.n_bytes for t in tensors) == shapes.tensor_bytes(shapes.SHAPES["wide-vocab"])


def test_measured_cards_replace_the_estimate_of_that_count_and_decide_the_fit(tmp_path):
    import os

    from app.fit.report import fit, render, same_request, with_measured

    model = read_model(shapes.write_model(tmp_path / "mid.gguf", "mid"))
    settings = Settings(ctx=4096, parallel=2)
    result = fit(model, settings, card_mib=1000, overhead_mib=500, max_fill=0.9)  # a limit of 900 MiB a card
    cuda = {"weights_mib": 50.0, "kv_mib": 4.0, "compute_mib": 10.0, "output_mib": 1.0}
    devices = {"CUDA0": cuda, "CUDA1": {**cuda, "weights_mib": 450.0}, "CUDA_Host": {**cuda, "weights_mib": 1.0}}
    server = {"id": 7, "ready_at": 1795966200, "cards": [3, 4], "model": os.path.realpath(model.path), "ctx": 4096,
              "parallel": 2, "cmdline": ["llama-server", "-fa", "on", "-ctk", "f16", "-ctv", "f16"],
              "measured": {"source": "lines", "devices": devices}}
    assert same_request(server, model, settings)
    assert result.option(2).fits
    measured = with_measured(result, server, overhead_mib=500)
    assert [c.total_mib for c in measured.option(2).per_card] == [565.0, 965.0]
    assert not measured.option(2).fits and measured.option(1) == result.option(1)
    assert measured.as_json()["measured"]["per_card"][1]["weights_mib"] == 450.0
    assert "measured on this server on " in render(measured) and "the 2-card row uses its figures" in render(measured)


@pytest.mark.parametrize("change", [
    {"ctx": 8192}, {"parallel": 1}, {"cmdline": ["llama-server", "-fa", "off", "-ctk", "f16", "-ctv", "f16"]},
    {"cmdline": ["llama-server", "-fa", "on", "-ctk", "q8_0", "-ctv", "f16"]},
    {"cmdline": ["llama-server", "-fa", "on", "-ctk", "f16", "-ctv", "f16", "-kvu"]}, {"model": "/elsewhere/mid.gguf"},
])
def test_a_server_with_other_settings_is_not_the_same_request(tmp_path, change):
    import os

    from app.fit.report import same_request

    model = read_model(shapes.write_model(tmp_path / "mid.gguf", "mid"))
    server = {"model": os.path.realpath(model.path), "ctx": 4096, "parallel": 2,
              "cmdline": ["llama-server", "-fa", "on", "-ctk", "f16", "-ctv", "f16"]}
    assert same_request(server, model, Settings(ctx=4096, parallel=2))
    assert not same_request({**server, **change}, model, Settings(ctx=4096, parallel=2))
