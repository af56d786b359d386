"""The GGUF reader byte by byte: each value type at its edges, the tensor index, and damaged or hostile headers.

The files are written here by hand (`gguf_bytes`), not with gguf.GGUFWriter, so a test can put any type, count,
version or offset where a real writer never would; tests/unit/test_fit.py reads the shapes the real writer makes.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from app.errors import BadInput
from app.fit.gguf_header import Counted, TensorInfo, read_header
from app.fit.gguf_model import UnknownArchitecture, read_model

U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
CODES = {U8: "B", I8: "b", U16: "H", I16: "h", U32: "I", I32: "i", F32: "f", BOOL: "?", U64: "Q", I64: "q", F64: "d"}
TYPES = {"F32": (0, 1, 4), "F16": (1, 1, 2), "Q4_0": (2, 32, 18), "Q8_0": (8, 32, 34)}  # id, block, bytes a block


def string(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def encode(kind: int, value) -> bytes:
    if kind == STR:
        return string(value)
    if kind == ARR:
        element, items = value
        return struct.pack("<IQ", element, len(items)) + b"".join(encode(element, x) for x in items)
    return struct.pack("<" + CODES[kind], value)


def gguf_bytes(fields=(), tensors=(), *, version: int = 3, alignment: int = 32) -> bytes:
    """A GGUF file: fields (key, type, value), tensors (name, dims, type name or id) one after another in the data
    section, which is zeros and ends where the last tensor does (the shortest file the reader accepts)."""
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(fields))
    out += b"".join(string(key) + struct.pack("<I", kind) + encode(kind, value) for key, kind, value in fields)
    offset = end = 0
    for name, dims, dtype in tensors:
        type_id, block, size = TYPES[dtype] if isinstance(dtype, str) else (dtype, 1, 0)
        n_bytes = _product(dims) // block * size
        out += string(name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, type_id, offset)
        end = offset + n_bytes
        offset = -(-end // alignment) * alignment
    start = -(-len(out) // alignment) * alignment
    return out + bytes(start - len(out)) + bytes(end)


def _product(dims) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def header(tmp_path: Path, fields=(), tensors=(), **kwargs):
    path = tmp_path / "h.gguf"
    path.write_bytes(gguf_bytes(fields, tensors, **kwargs))
    return read_header(path)


def refused(tmp_path: Path, data: bytes) -> str:
    path = tmp_path / "bad.gguf"
    path.write_bytes(data)
    with pytest.raises(ValueError) as caught:
        read_header(path)
    return str(caught.value)


class TestValues:
    # Values that tell each type from its neighbours: the sign, the width, float from double.
    SCALARS = [(U8, 200), (I8, -56), (U16, 60000), (I16, -30000), (U32, 4_000_000_000), (I32, -2_000_000_000),
               (F32, 1.5), (BOOL, True), (U64, 2**63 + 1), (I64, -(2**62)), (F64, 0.1)]

    def test_each_scalar_type_and_the_field_after_it(self, tmp_path):
        fields = []
        for kind, value in self.SCALARS:
            fields += [(f"k{kind}", kind, value), (f"after{kind}", STR, f"s{kind}")]
        got, tensors = header(tmp_path, fields)
        assert tensors == []
        for kind, value in self.SCALARS:
            assert got[f"k{kind}"] == value and type(got[f"k{kind}"]) is type(value), kind
            assert got[f"after{kind}"] == f"s{kind}"
        assert struct.unpack("<f", struct.pack("<f", 0.1))[0] != 0.1  # so F64's 0.1 is read as a double

    def test_strings_empty_and_not_utf8(self, tmp_path):
        got, _ = header(tmp_path, [("", STR, ""), ("bad", STR, b"a\xffb"), ("next", U8, 7)])
        assert got == {"": "", "bad": "a\ufffdb", "next": 7}

    @pytest.mark.parametrize("kind", sorted(CODES))
    def test_arrays_up_to_4096_are_kept_longer_ones_counted(self, tmp_path, kind):
        one = 1.0 if kind in (F32, F64) else True if kind == BOOL else 1
        got, _ = header(tmp_path, [("small", ARR, (kind, [one] * 4096)), ("big", ARR, (kind, [one] * 4097)),
                                   ("next", STR, "n")])
        assert got["small"] == [one] * 4096
        assert got["big"] == Counted(4097)
        assert got["next"] == "n"

    def test_a_short_array_keeps_its_values_in_order(self, tmp_path):
        got, _ = header(tmp_path, [("heads", ARR, (I32, [4, -2, 0])), ("empty", ARR, (U32, []))])
        assert got == {"heads": [4, -2, 0], "empty": []}

    def test_string_arrays_are_counted_and_skipped(self, tmp_path):
        got, _ = header(tmp_path, [("tokens", ARR, (STR, ["a", "", "ccc"])), ("next", U16, 9)])
        assert got == {"tokens": Counted(3), "next": 9}

    def test_versions_2_and_3_are_read(self, tmp_path):
        for version in (2, 3):
            assert header(tmp_path, [("k", U8, 1)], version=version)[0] == {"k": 1}

    @pytest.mark.parametrize("version", [1, 4, 0x03000000, 2**32 - 1])  # a big-endian version 3; unsigned
    def test_other_versions_are_refused(self, tmp_path, version):
        assert refused(tmp_path, gguf_bytes(version=version)) == f"GGUF version {version} is not one llama.cpp reads"

    def test_a_big_endian_file_is_refused_by_its_version(self, tmp_path):
        data = b"GGUF" + struct.pack(">IQQ", 3, 0, 0)
        assert refused(tmp_path, data) == "GGUF version 50331648 is not one llama.cpp reads"

    def test_not_gguf(self, tmp_path):
        assert refused(tmp_path, b"GGUG" + gguf_bytes()[4:]) == "not a GGUF file"

    def test_unknown_value_types(self, tmp_path):
        for kind in (13, 2**32 - 1):  # the type is unsigned
            data = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + string("k") + struct.pack("<IQ", kind, 0)
            assert refused(tmp_path, data) == f"unknown GGUF value type {kind}"

    def test_unknown_array_element_types(self, tmp_path):
        for element in (13, ARR, 2**32 - 1):  # nor arrays of arrays
            data = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + string("k") + struct.pack("<IIQ", ARR, element, 0)
            assert refused(tmp_path, data) == f"unknown GGUF array element type {element}"


class TestTensors:
    def test_sizes_types_and_names(self, tmp_path):
        _, tensors = header(tmp_path, [], [("a", [64, 3], "Q4_0"), ("b", [5, 7], "F32"), ("c", [2, 3, 4], "F16"),
                                           ("d", [], "F32")])
        # Q4_0: 192 values in 6 blocks of 18 bytes; F32 35 x 4; F16 24 x 2; no dimensions: one value
        assert tensors == [TensorInfo("a", "Q4_0", 108), TensorInfo("b", "F32", 140), TensorInfo("c", "F16", 48),
                           TensorInfo("d", "F32", 4)]

    def test_eight_dimensions_are_read_nine_refused(self, tmp_path):
        assert header(tmp_path, [], [("t", [1] * 8, "F32")])[1] == [TensorInfo("t", "F32", 4)]
        name = "n" * 50  # named in the message up to 40 characters
        assert refused(tmp_path, gguf_bytes([], [(name, [1] * 9, "F32")])) == f"tensor {'n' * 40!r} claims 9 dimensions"

    def test_an_unknown_tensor_type_is_refused(self, tmp_path):
        assert refused(tmp_path, gguf_bytes([], [("m" * 41, [4], 4)])) == f"tensor {'m' * 40!r} has an unknown type 4"
        assert refused(tmp_path, gguf_bytes([], [("m", [4], 2**32 - 1)])) == "tensor 'm' has an unknown type 4294967295"

    def test_the_counts_and_sizes_are_unsigned(self, tmp_path):
        tensor = b"GGUF" + struct.pack("<IQQ", 3, 1, 0) + string("t")
        assert refused(tmp_path, tensor + struct.pack("<I", 2**32 - 1)) == "tensor 't' claims 4294967295 dimensions"
        # 3 x 2**63 values: not a negative size; the header ends at 65, the data would start at 96
        huge = tensor + struct.pack("<I2QIQ", 2, 2**63, 3, 0, 0)
        assert refused(tmp_path, huge) == f"the tensor data is cut off: {96 + 3 * 2**65} bytes needed, 65 in the file"
        # an offset beyond any file, not before the data: the header ends at 57, the data starts at 64
        far = tensor + struct.pack("<I1QIQ", 1, 1, 0, 2**64 - 8) + bytes(68 - 57)
        assert refused(tmp_path, far) == f"the tensor data is cut off: {64 + 2**64 - 4} bytes needed, 68 in the file"

    def test_the_data_must_reach_the_last_tensor_end(self, tmp_path):
        # the header ends at byte 93, so the data starts at 96; the later tensor (offset 0, 400 bytes) ends at 496
        data = gguf_bytes([], [("a", [10], "F32"), ("b", [100], "F32")])
        last = len(data)
        assert last == 96 + 64 + 400  # "b" starts at 64: "a"'s 40 bytes padded to 32
        path = tmp_path / "ok.gguf"
        path.write_bytes(data)
        assert [t.n_bytes for t in read_header(path)[1]] == [40, 400]
        assert refused(tmp_path, data[:-1]) == f"the tensor data is cut off: {last} bytes needed, {last - 1} in the file"

    def test_the_data_starts_at_the_next_multiple_of_the_alignment(self, tmp_path):
        fields = [("general.alignment", U32, 64)]
        data = gguf_bytes(fields, [("t", [1], "F32")], alignment=64)
        header_end = 4 + 4 + 16 + len(string("general.alignment")) + 4 + 4 + len(string("t")) + 4 + 8 + 4 + 8
        assert 64 < header_end < 128 and len(data) == 128 + 4  # at 96 if the alignment were 32
        path = tmp_path / "a.gguf"
        path.write_bytes(data)
        assert read_header(path)[1] == [TensorInfo("t", "F32", 4)]
        assert refused(tmp_path, data[:-1]) == "the tensor data is cut off: 132 bytes needed, 131 in the file"

    def test_the_default_alignment_is_32(self, tmp_path):
        # the header ends at 57: 32-aligned data starts at 64 and ends at 68; 33-aligned it would start at 66
        data = gguf_bytes([], [("t", [1], "F32")])
        assert len(data) == 68
        assert refused(tmp_path, data[:-1]) == "the tensor data is cut off: 68 bytes needed, 67 in the file"
        path = tmp_path / "ok.gguf"
        path.write_bytes(data)
        assert read_header(path)[1] == [TensorInfo("t", "F32", 4)]

    def test_an_alignment_of_one_packs_the_data(self, tmp_path):
        got, tensors = header(tmp_path, [("general.alignment", U8, 1)], [("t", [3], "F32")], alignment=1)
        assert got["general.alignment"] == 1 and tensors == [TensorInfo("t", "F32", 12)]

    @pytest.mark.parametrize("kind,value", [(U32, 0), (I32, -32), (STR, "32"), (F32, 32.0)])
    def test_an_alignment_that_is_not_a_positive_number_is_refused(self, tmp_path, kind, value):
        data = gguf_bytes([("general.alignment", kind, value)], [("t", [1], "F32")])
        assert refused(tmp_path, data) == "general.alignment is not a positive number"

    def test_the_tensor_offsets_count_from_the_data_section(self, tmp_path):
        data = bytearray(gguf_bytes([], [("t", [1], "F32")]))
        data[49:57] = struct.pack("<Q", 8)  # t's offset: 8, so its 4 bytes end 12 bytes into the data
        assert refused(tmp_path, bytes(data)) == "the tensor data is cut off: 76 bytes needed, 68 in the file"


class TestDamaged:
    def test_every_truncation_is_a_value_error(self, tmp_path):
        data = gguf_bytes([("a", U32, 1), ("s", STR, "text"), ("arr", ARR, (U16, [1, 2])),
                           ("toks", ARR, (STR, ["x", "yy"]))], [("t", [2, 3], "F32")])
        for keep in range(4, len(data)):
            message = refused(tmp_path, data[:keep])
            assert message.startswith(("the header runs past the end of the file at byte ", "the tensor data is cut off")), keep

    def test_the_byte_where_the_header_ends_early_is_named(self, tmp_path):
        data = gguf_bytes([("key", STR, "abcdef")])
        # the string's length is at 24 + 8 + 3 + 4 = 39 and its text at 47: cut inside the text
        assert refused(tmp_path, data[:50]) == "the header runs past the end of the file at byte 47"
        assert refused(tmp_path, data[:45]) == "the header runs past the end of the file at byte 39"

    def test_a_header_of_just_the_magic(self, tmp_path):
        assert refused(tmp_path, b"GGUF") == "the header runs past the end of the file at byte 4"

    @pytest.mark.parametrize("data", [
        b"GGUF" + struct.pack("<IQQ", 3, 2**64 - 1, 2**64 - 1),  # counts far beyond the file
        b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 2**63) + b"k",  # a key longer than the file
        b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + string("k") + struct.pack("<IIQ", ARR, U64, 2**61),
        b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + string("k") + struct.pack("<IIQ", ARR, STR, 2**64 - 1),
        b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + string("k") + struct.pack("<IIQ", ARR, U8, 4000),
    ], ids=["counts", "key-length", "numbers", "strings", "short-array"])
    def test_hostile_lengths_are_refused_without_allocating(self, tmp_path, data):
        assert refused(tmp_path, data).startswith("the header runs past the end of the file at byte ")

    def test_a_tensor_of_huge_dimensions_is_cut_off(self, tmp_path):
        data = b"GGUF" + struct.pack("<IQQ", 3, 1, 0) + string("t") + struct.pack("<I2QIQ", 2, 2**63, 2**63, 0, 0)
        assert refused(tmp_path, data).startswith("the tensor data is cut off: ")


# What board can size, spelled out here so that a misspelt name in gguf_model fails a test.
ARCHITECTURES = ["llama", "mistral3", "qwen2", "qwen2moe", "qwen3", "qwen3moe", "phi3", "internlm2", "gemma",
                 "starcoder2", "command-r", "olmo2", "granite", "granitemoe", "deci", "gemma2", "gemma3", "cohere2",
                 "gpt-oss"]


def model_file(tmp_path: Path, arch: str = "llama", fields=None, tensors=(), *, layers: int = 2,
               name: str = "m.gguf") -> Path:
    """A model with the keys read_model needs (2 layers, 64 wide, 4 heads) and `fields` on top: a key starting with
    "." belongs to the architecture, a value None drops the key."""
    given = {"general.architecture": (STR, arch), ".block_count": (U32, layers), ".embedding_length": (U32, 64),
             ".attention.head_count": (U32, 4), **(fields or {})}
    keyed = [((arch + key if key.startswith(".") else key), *v) for key, v in given.items() if v is not None]
    path = tmp_path / name
    path.write_bytes(gguf_bytes(keyed, tensors))
    return path


def refusal(path: Path, kind: type = BadInput) -> str:
    with pytest.raises(BadInput) as caught:
        read_model(path)
    assert type(caught.value) is kind
    return str(caught.value)


class TestModelKeys:
    @pytest.mark.parametrize("arch", ARCHITECTURES)
    def test_each_known_architecture_is_read(self, tmp_path, arch):
        assert read_model(model_file(tmp_path, arch)).arch == arch

    def test_an_unknown_architecture_names_those_known(self, tmp_path):
        path = model_file(tmp_path, "mamba")
        assert refusal(path, UnknownArchitecture) == (
            f"{path}: board can't size the 'mamba' architecture yet (it knows {', '.join(sorted(ARCHITECTURES))}); "
            "give llama-server's own figures a try")

    @pytest.mark.parametrize("arch", [None, (U32, 7), (ARR, (STR, ["llama"]))])
    def test_no_architecture(self, tmp_path, arch):
        path = model_file(tmp_path, fields={"general.architecture": arch})
        assert refusal(path) == f"{path}: the GGUF header names no architecture (general.architecture)"

    @pytest.mark.parametrize("key", ["block_count", "embedding_length", "attention.head_count"])
    def test_a_required_key_missing(self, tmp_path, key):
        path = model_file(tmp_path, fields={f".{key}": None})
        assert refusal(path) == f"{path}: the GGUF header lacks llama.{key}"

    def test_the_defaults_of_a_bare_header(self, tmp_path):
        path = model_file(tmp_path)
        model = read_model(path)
        assert (model.path, model.name, model.n_layer, model.n_embd) == (str(path), "m.gguf", 2, 64)
        assert (model.n_head, model.n_head_kv, model.n_ff) == ((4, 4), (4, 4), (0, 0))  # KV heads: the heads
        assert (model.head_k, model.head_v) == (16, 16)  # the width over the heads
        assert (model.n_vocab, model.n_ctx_train, model.n_expert, model.n_expert_used) == (0, 0, 0, 0)
        assert (model.swa, model.n_swa) == ((False, False), 0)
        assert (model.layer_bytes, model.input_bytes, model.output_bytes, model.tensor_bytes) == ((0, 0), 0, 0, 0)
        assert model.tied_output is True and model.weight_type == "F32"
        assert model.file_bytes == path.stat().st_size

    def test_the_keys_that_override_the_defaults(self, tmp_path):
        model = read_model(model_file(tmp_path, fields={
            "general.name": (STR, "Named"), ".context_length": (U32, 8192), ".attention.head_count_kv": (U32, 2),
            ".feed_forward_length": (U32, 256), ".attention.key_length": (U32, 24),
            ".attention.value_length": (U32, 40), ".vocab_size": (U32, 1000),
            "tokenizer.ggml.tokens": (ARR, (STR, ["a", "b", "c"])), ".expert_used_count": (U32, 2)}))
        assert (model.name, model.n_ctx_train, model.n_head_kv, model.n_ff) == ("Named", 8192, (2, 2), (256, 256))
        assert (model.head_k, model.head_v, model.n_embd_k_gqa(1), model.n_embd_v_gqa(1)) == (24, 40, 48, 80)
        assert (model.n_vocab, model.n_expert, model.n_expert_used) == (1000, 0, 2)  # vocab_size beats the tokens

    def test_the_vocabulary_is_counted_from_the_tokens(self, tmp_path):
        tokens = {"tokenizer.ggml.tokens": (ARR, (STR, ["a", "b", "c"]))}
        assert read_model(model_file(tmp_path, fields=tokens)).n_vocab == 3
        assert read_model(model_file(tmp_path, fields={**tokens, ".vocab_size": (U32, 0)})).n_vocab == 3

    def test_experts_take_their_own_feed_forward_width(self, tmp_path):
        moe = {".expert_count": (U32, 8), ".expert_used_count": (U32, 2), ".feed_forward_length": (U32, 128)}
        model = read_model(model_file(tmp_path, fields={**moe, ".expert_feed_forward_length": (U32, 96)}))
        assert (model.n_expert, model.n_expert_used, model.n_ff) == (8, 2, (96, 96))
        assert read_model(model_file(tmp_path, fields=moe)).n_ff == (128, 128)  # none given: the dense width
        dense = read_model(model_file(tmp_path, fields={".expert_count": (U32, 0), ".feed_forward_length": (U32, 128),
                                                        ".expert_feed_forward_length": (U32, 96)}))
        assert (dense.n_expert, dense.n_ff) == (0, (128, 128))

    def test_per_layer_arrays_and_the_first_layer_sets_the_head_size(self, tmp_path):
        model = read_model(model_file(tmp_path, "deci", {".attention.head_count": (ARR, (U32, [4, 8])),
                                                         ".attention.head_count_kv": (ARR, (I32, [2, 0])),
                                                         ".feed_forward_length": (ARR, (U16, [128, 64]))}))
        assert (model.n_head, model.n_head_kv, model.n_ff) == ((4, 8), (2, 0), (128, 64))
        assert (model.head_k, model.head_v) == (16, 16)  # 64 / 4, layer 0's heads

    def test_a_per_layer_array_of_the_wrong_length(self, tmp_path):
        path = model_file(tmp_path, fields={".attention.head_count_kv": (ARR, (U32, [2, 2, 2]))})
        assert refusal(path) == "a per-layer GGUF array has 3 entries for 2 layers"

    def test_an_array_too_long_to_be_per_layer(self, tmp_path):
        path = model_file(tmp_path, fields={".attention.head_count_kv": (ARR, (U8, [1] * 4097))})
        assert refusal(path) == (f"{path}: the GGUF field llama.attention.head_count_kv is an array of 4097, "
                                 "too long to be per layer")

    def test_a_layer_without_heads(self, tmp_path):
        path = model_file(tmp_path, fields={".attention.head_count": (ARR, (U32, [4, 0]))})
        assert refusal(path) == f"{path}: a layer has no attention heads; board can't size this model"


class TestSlidingWindow:
    def swa(self, tmp_path, arch, layers, **fields):
        keys = {f".attention.{k}": v for k, v in fields.items()}
        model = read_model(model_file(tmp_path, arch, keys, layers=layers))
        return model.swa, model.n_swa

    def test_gemma2_defaults_to_a_4096_window_on_every_other_layer(self, tmp_path):
        assert self.swa(tmp_path, "gemma2", 4) == ((True, False, True, False), 4096)
        assert self.swa(tmp_path, "gemma2", 4, sliding_window=(U32, 0)) == ((False,) * 4, 0)

    def test_the_others_have_a_window_only_when_the_header_gives_one(self, tmp_path):
        for arch in ("gemma3", "cohere2", "gpt-oss"):
            assert self.swa(tmp_path, arch, 3) == ((False,) * 3, 0), arch
        assert self.swa(tmp_path, "llama", 3, sliding_window=(U32, 512)) == ((False,) * 3, 0)  # llama has none

    def test_each_architecture_default_pattern(self, tmp_path):
        window = {"sliding_window": (U32, 512)}
        # every n-th layer attends in full: gemma3 6, cohere2 4, gpt-oss and gemma2 2
        assert self.swa(tmp_path, "gemma3", 7, **window) == ((True,) * 5 + (False, True), 512)
        assert self.swa(tmp_path, "cohere2", 5, **window) == ((True,) * 3 + (False, True), 512)
        assert self.swa(tmp_path, "gpt-oss", 3, **window) == ((True, False, True), 512)
        assert self.swa(tmp_path, "gemma2", 3, **window) == ((True, False, True), 512)

    def test_a_pattern_from_the_header(self, tmp_path):
        window = {"sliding_window": (U32, 128)}
        assert self.swa(tmp_path, "gemma2", 4, **window, sliding_window_pattern=(U32, 3)) == (
            (True, True, False, True), 128)
        assert self.swa(tmp_path, "gemma2", 3, **window, sliding_window_pattern=(U32, 0)) == ((True,) * 3, 128)
        assert self.swa(tmp_path, "gemma3", 3, **window, sliding_window_pattern=(ARR, (BOOL, [False, True, True]))) \
            == ((False, True, True), 128)


class TestModelTensors:
    def test_tensors_are_grouped_as_llama_cpp_places_them(self, tmp_path):
        model = read_model(model_file(tmp_path, tensors=[
            ("token_embd.weight", [4, 10], "F32"), ("position_embd.weight", [4, 3], "F32"),
            ("token_types.weight", [4, 2], "F32"),  # the input layer: 160 + 48 + 32
            ("blk.0.attn_q.weight", [8], "F32"), ("blk.1.attn_q.weight", [16], "F32"), ("blk.1.ffn", [2], "F32"),
            ("blk.2.attn_q.weight", [1], "F32"),  # a block past block_count: the output layer's
            ("rope_freqs.weight", [5], "F32"),  # a copy in each layer
            ("output_norm.weight", [3], "F32"), ("output.weight", [4, 6], "F32")]))
        assert (model.input_bytes, model.layer_bytes, model.output_bytes) == (240, (32 + 20, 72 + 20), 4 + 12 + 96)
        assert model.tied_output is False
        assert model.tensor_bytes == 240 + 32 + 72 + 4 + 20 + 12 + 96  # each once, rope_freqs too
        assert model.weights_bytes == 240 + 52 + 92 + 112

    def test_a_tied_output_loads_the_token_embedding_again(self, tmp_path):
        model = read_model(model_file(tmp_path, tensors=[
            ("token_embd.weight", [4, 10], "F32"), ("position_embd.weight", [4, 3], "F32"),
            ("output_norm.weight", [3], "F32"), ("output.bias", [2], "F32")]))
        assert (model.input_bytes, model.output_bytes, model.tied_output) == (208, 12 + 8 + 160, True)
        assert model.tensor_bytes == 208 + 20 and model.weights_bytes == 208 + 180

    def test_the_weight_type_is_the_largest_total_of_tensors_from_1_mib(self, tmp_path):
        mib = 1 << 20
        model = read_model(model_file(tmp_path, tensors=[
            ("blk.0.a", [mib // 2], "F16"), ("blk.1.a", [mib // 2], "F16"),  # 1 MiB each: 2 MiB of F16
            ("blk.0.b", [32 * 46262], "Q8_0"),  # 1.5 MiB of Q8_0: the largest single tensor
            ("blk.0.c", [mib // 4 - 1], "F32"), ("blk.1.c", [mib // 4 - 1], "F32"), ("blk.0.d", [mib // 4 - 1], "F32"),
        ]))  # 3 F32 tensors just under 1 MiB: not counted
        assert model.weight_type == "F16"
        only_small = read_model(model_file(tmp_path, tensors=[("blk.0.c", [mib // 2 - 1], "F16")],
                                           name="small.gguf"))
        assert only_small.weight_type == "F32"  # nothing large: the default
        one = read_model(model_file(tmp_path, tensors=[("blk.0.a", [mib // 2], "F16")], name="one.gguf"))
        assert one.weight_type == "F16"  # exactly 1 MiB counts


class TestModelFiles:
    def test_a_split_model_is_read_from_any_of_its_files(self, tmp_path):
        for i, tensors in enumerate([[("token_embd.weight", [4, 10], "F32")], [("blk.0.a", [8], "F32")],
                                     [("blk.1.a", [4], "F32"), ("output.weight", [2], "F32")]], start=1):
            model_file(tmp_path, tensors=tensors, name=f"m-{i:05d}-of-00003.gguf")
        model_file(tmp_path, tensors=[("blk.0.a", [1000], "F32")], name="m-00004-of-00004.gguf")  # not the model's
        sizes = sum((tmp_path / f"m-{i:05d}-of-00003.gguf").stat().st_size for i in (1, 2, 3))
        for i in (1, 2, 3):
            model = read_model(tmp_path / f"m-{i:05d}-of-00003.gguf")
            assert (model.input_bytes, model.layer_bytes, model.output_bytes) == (160, (32, 16), 8)
            assert (model.file_bytes, model.path) == (sizes, str(tmp_path / f"m-{i:05d}-of-00003.gguf"))
        (tmp_path / "m-00003-of-00003.gguf").unlink()
        assert refusal(tmp_path / "m-00001-of-00003.gguf") == f"no model file {tmp_path / 'm-00003-of-00003.gguf'}"

    def test_a_name_like_a_split_is_one_file(self, tmp_path):
        path = model_file(tmp_path, tensors=[("blk.0.a", [8], "F32")], name="m-00001-of-00002.gguf.gguf")
        assert read_model(path).layer_bytes == (32, 0)

    def test_missing(self, tmp_path):
        assert refusal(tmp_path / "nope.gguf") == f"no model file {tmp_path / 'nope.gguf'}"

    def test_a_directory(self, tmp_path):
        assert refusal(tmp_path) == f"{tmp_path} is a directory; give a .gguf file"

    def test_a_path_through_a_file(self, tmp_path):
        (tmp_path / "file").write_bytes(b"")
        assert refusal(tmp_path / "file" / "m.gguf") == f"can't read {tmp_path / 'file' / 'm.gguf'}: Not a directory"

    def test_not_gguf(self, tmp_path):
        (tmp_path / "text.gguf").write_text("hello\n")
        assert refusal(tmp_path / "text.gguf") == f"{tmp_path / 'text.gguf'} is not a GGUF file"

    @pytest.mark.timeout(60)  # a hang guard: the reader that waited for a writer never returned
    def test_a_fifo_is_not_waited_on(self, tmp_path):
        os.mkfifo(tmp_path / "pipe.gguf")
        assert refusal(tmp_path / "pipe.gguf") == f"{tmp_path / 'pipe.gguf'} is not a GGUF file"
        writer = os.open(tmp_path / "pipe.gguf", os.O_RDWR)  # a writer that never writes: a read would wait
        try:
            assert refusal(tmp_path / "pipe.gguf") == f"{tmp_path / 'pipe.gguf'} is not a GGUF file"
        finally:
            os.close(writer)

    def test_a_device_is_not_a_model(self):
        assert refusal(Path("/dev/zero")) == "/dev/zero is not a GGUF file"

    def test_damaged_names_the_reason(self, tmp_path):
        (tmp_path / "v4.gguf").write_bytes(gguf_bytes(version=4))
        assert refusal(tmp_path / "v4.gguf") == (
            f"{tmp_path / 'v4.gguf'}: the GGUF header is damaged (GGUF version 4 is not one llama.cpp reads)")

    def test_a_long_reason_is_cut_to_80_characters(self, tmp_path):
        (tmp_path / "t.gguf").write_bytes(gguf_bytes([], [("\0" * 40, [1], 99)]))
        reason = f"tensor {chr(0) * 40!r} has an unknown type 99"
        assert len(reason) > 81
        assert refusal(tmp_path / "t.gguf") == f"{tmp_path / 't.gguf'}: the GGUF header is damaged ({reason[:80]})"

    def test_the_home_directory_is_expanded(self, tmp_path, monkeypatch):
        monkeypatch.setenv("HOME", str(tmp_path))
        model_file(tmp_path)
        assert read_model("~/m.gguf").path == str(tmp_path / "m.gguf")


class TestHostileModels:
    """A header whose values llama.cpp would refuse: one line, never a traceback or a huge allocation."""

    @pytest.mark.parametrize("count", [(U32, 0), (U32, 513)])
    def test_a_layer_count_llama_cpp_would_not_load(self, tmp_path, count):
        path = model_file(tmp_path, fields={".block_count": count})
        assert refusal(path) == f"{path}: llama.block_count is {count[1]}; llama.cpp reads 1 to 512 layers"

    def test_1_and_512_layers_are_read(self, tmp_path):
        assert read_model(model_file(tmp_path, layers=1)).n_head == (4,)
        assert read_model(model_file(tmp_path, layers=512)).n_head == (4,) * 512

    @pytest.mark.parametrize("key,value", [
        (".embedding_length", (STR, "64")), (".embedding_length", (F32, 64.0)), (".embedding_length", (F64, 1e400)),
        (".embedding_length", (I32, -64)), (".block_count", (STR, "two")), (".attention.head_count", (F32, 4.5)),
        (".attention.head_count_kv", (ARR, (F32, [2.0, float("nan")]))), (".expert_count", (STR, "8")),
        (".context_length", (I64, -1)), (".vocab_size", (F64, float("inf"))), (".block_count", (ARR, (U32, [2, 2]))),
        (".embedding_length", (ARR, (U32, [64]))), (".attention.sliding_window", (ARR, (U32, [1, 1]))),
    ])
    def test_a_value_that_is_not_a_count(self, tmp_path, key, value):
        path = model_file(tmp_path, "gemma2", fields={key: value})
        assert refusal(path) == f"{path}: the GGUF field gemma2{key} is not a count (a whole number, 0 or more)"

    def test_a_window_pattern_not_one_per_layer(self, tmp_path):
        for pattern in ([True], [True, False, True, False]):
            path = model_file(tmp_path, "gemma2", {".attention.sliding_window_pattern": (ARR, (BOOL, pattern))},
                              layers=3)
            assert refusal(path) == f"a per-layer GGUF array has {len(pattern)} entries for 3 layers"
