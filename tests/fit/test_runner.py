"""The real CPU llama-server loads every shape, and tests/fit/runner.measure reads what it allocated.

The KV figures are checked against the sizes llama.cpp's source gives (this build):
- llama_context: n_ctx = pad256(ctx); without a unified cache, n_ctx_seq = pad256(n_ctx / np) (integer division) and
  n_ctx = n_ctx_seq * np, which can round n_ctx up (1000 / 3 -> 512 * 3 = 1536); unified: n_ctx_seq = n_ctx.
- llama_kv_cache: n_stream = np (1 when unified), kv_size = n_ctx_seq cells per stream, and per layer a K and a V
  tensor of n_embd_k_gqa (n_embd_v_gqa) x kv_size x n_stream of the cache type. Without flash attention V is stored
  transposed, and then every layer's V is as wide as the widest layer's (n_embd_v_gqa_max, [TAG_V_CACHE_VARIABLE]).
- llama_kv_cache_iswa: the windowed layers' cache has pad256(min(kv_size, n_swa * (np if unified else 1) + n_ubatch))
  cells.
"""

from __future__ import annotations

import pytest

from app.llama.memory import read_memory
from tests.fit.runner import ServerRefused, measure, run_server, server_argv
from tests.fit.shapes import SHAPES, Shape, tensor_bytes


MiB = 2**20
# The log prints MiB with two decimals.
PRINTED = 0.005 + 1e-9
UBATCH = 512  # llama-server's default -ub


def pad(value: int, to: int = 256) -> int:
    return (value + to - 1) // to * to


def context(ctx: int, parallel: int, unified: bool) -> tuple[int, int, int]:
    """(n_ctx, cells per stream, streams)."""
    n_ctx = pad(ctx)
    if unified:
        return n_ctx, n_ctx, 1
    per_seq = pad(n_ctx // parallel)
    return per_seq * parallel, per_seq, parallel


def row_bytes(cache_type: str, width: int) -> int:
    """ggml_row_size: f32 4 bytes, f16 2; q8_0 34 and q4_0 18 bytes per block of 32."""
    per_block = {"f32": (1, 4), "f16": (1, 2), "q8_0": (32, 34), "q4_0": (32, 18)}[cache_type]
    return width // per_block[0] * per_block[1]


def expected_caches(shape: Shape, ctx: int, parallel: int, unified: bool, type_k: str = "f16", type_v: str = "f16",
                    flash_attn: bool = False) -> list[tuple[int, int]]:
    """[(cells, bytes)] per KV cache: the full one, then (with a window) the windowed one."""
    _, cells, streams = context(ctx, parallel, unified)
    widest = max(shape.n_embd_kv(layer) for layer in range(shape.n_layer))
    caches: dict[bool, list[int]] = {}
    for layer in range(shape.n_layer):
        windowed = shape.is_swa(layer)
        size = pad(min(cells, shape.sliding_window * (parallel if unified else 1) + UBATCH)) if windowed else cells
        k_width = shape.n_embd_kv(layer)
        v_width = k_width if flash_attn else widest
        caches.setdefault(windowed, [size, 0])[1] += streams * size * (row_bytes(type_k, k_width) + row_bytes(type_v, v_width))
    return [tuple(caches[windowed]) for windowed in (False, True) if windowed in caches]


@pytest.mark.parametrize("name", list(SHAPES))
def test_every_shape_loads_and_reports_weights_kv_and_compute(llama_server, model_path, name):
    shape = SHAPES[name]
    measured = measure(llama_server, model_path(name), ctx=2048, parallel=2)
    assert measured.source == "lines"
    assert measured.weights_mib > 0 and measured.kv_mib > 0 and measured.compute_mib > 0
    # The file is mapped whole: the mapped weights are the tensors' bytes, whatever else is repacked.
    assert measured.devices["CPU_Mapped"].weights_mib == pytest.approx(tensor_bytes(shape) / MiB, abs=PRINTED)
    caches = expected_caches(shape, 2048, 2, False)
    assert [cache.cells for cache in measured.kv_caches] == [cells for cells, _ in caches]
    assert measured.kv_mib == pytest.approx(sum(size for _, size in caches) / MiB, abs=PRINTED * len(caches))


SETTINGS = [
    ("tiny", 2048, 2, False),
    ("tiny", 1000, 3, False),  # 1024 / 3 = 341 -> 512 per sequence: n_ctx grows to 1536
    ("tiny", 1000, 3, True),
    ("tiny", 100, 1, False),
    ("tiny", 300, 4, False),  # 512 / 4 = 128 -> 256 per sequence, 1024 in all
    ("gqa8", 4096, 4, False),
    ("gqa8", 5000, 3, True),  # more than the model's 4096 of training context: a warning, not a refusal
    ("deep", 3000, 5, False),
    ("per-layer", 1500, 2, False),
    ("swa", 2048, 1, False),  # window 256 + ubatch 512 -> 768 cells
    ("swa", 4096, 4, True),  # unified: 256 * 4 + 512 -> 1536
    ("swa", 512, 2, False),  # the full cache (256) is smaller than the window's
]


@pytest.mark.parametrize(("name", "ctx", "parallel", "unified"), SETTINGS)
def test_the_kv_cache_follows_the_padding_rules(llama_server, model_path, name, ctx, parallel, unified):
    measured = measure(llama_server, model_path(name), ctx=ctx, parallel=parallel, unified=unified)
    n_ctx, cells, streams = context(ctx, parallel, unified)
    assert (measured.n_ctx, measured.n_ctx_seq) == (n_ctx, cells)
    caches = expected_caches(SHAPES[name], ctx, parallel, unified)
    assert [(c.cells, c.seqs, c.streams) for c in measured.kv_caches] == [(cells, parallel, streams) for cells, _ in caches]
    assert [c.mib for c in measured.kv_caches] == pytest.approx([size / MiB for _, size in caches], abs=PRINTED)
    assert measured.kv_mib == pytest.approx(sum(size for _, size in caches) / MiB, abs=PRINTED * len(caches))


@pytest.mark.parametrize("flash_attn", ["off", "on"])
def test_per_layer_kv_heads_widen_v_without_flash_attention(llama_server, model_path, flash_attn):
    shape = SHAPES["per-layer"]
    measured = measure(llama_server, model_path("per-layer"), ctx=2048, parallel=2, flash_attn=flash_attn)
    ((_, size),) = expected_caches(shape, 2048, 2, False, flash_attn=flash_attn == "on")
    assert measured.kv_mib == pytest.approx(size / MiB, abs=PRINTED)
    # K is per layer either way: 1024 cells x 2 streams x (4 + 2 + 1 + 2) heads x 32 x 2 bytes.
    assert measured.kv_caches[0].k_mib == pytest.approx(1024 * 2 * 9 * 32 * 2 / MiB, abs=PRINTED)


@pytest.mark.parametrize(("type_k", "type_v", "flash_attn"), [
    ("q8_0", "q8_0", "on"),
    ("q4_0", "q4_0", "on"),
    ("q8_0", "q4_0", "on"),
    ("q8_0", "f16", "off"),  # only a quantised V needs flash attention
    ("f32", "f32", "off"),
])
def test_cache_types_size_the_kv_cache(llama_server, model_path, type_k, type_v, flash_attn):
    measured = measure(llama_server, model_path("gqa8"), ctx=2048, parallel=2, cache_type_k=type_k, cache_type_v=type_v,
                       flash_attn=flash_attn)
    (cache,) = measured.kv_caches
    assert (cache.type_k, cache.type_v) == (type_k, type_v)
    ((_, size),) = expected_caches(SHAPES["gqa8"], 2048, 2, False, type_k, type_v, flash_attn == "on")
    assert measured.kv_mib == pytest.approx(size / MiB, abs=PRINTED)


@pytest.mark.parametrize(("name", "settings", "message"), [
    ("gqa8", {"cache_type_v": "q8_0", "flash_attn": "off"}, "quantized V cache requires flash_attn to be enabled"),
    ("tiny", {"cache_type_k": "q8_0", "flash_attn": "on"},
     "K cache type q8_0 with block size 32 does not divide n_embd_head_k=16"),
    ("tiny", {"flash_attn": "sometimes"}, "unknown value for --flash-attn: 'sometimes'"),
])
def test_a_setting_llama_cpp_refuses_raises_its_message(llama_server, model_path, name, settings, message):
    with pytest.raises(ServerRefused) as refused:
        measure(llama_server, model_path(name), ctx=2048, parallel=1, **settings)
    assert message in refused.value.message


def test_the_exit_breakdown_agrees_with_the_lines(llama_server, model_path):
    """The breakdown is whole MiB (integer division of bytes) per device and for the host; it leaves out the
    output buffer. The runner stops the server with SIGTERM, so the exit breakdown is the last one."""
    run = run_server(server_argv(llama_server, model_path("mid"), ctx=4096, parallel=2))
    lines = read_memory(run.lines)
    breakdown = read_memory([line for line in run.lines if '"fit_memory_breakdown"' in line])
    assert run.returncode == 0 and breakdown.source == "breakdown"
    host = breakdown.devices["Host"]
    for whole, decimal in ((host.weights_mib, lines.weights_mib), (host.kv_mib, lines.kv_mib),
                           (host.compute_mib, lines.compute_mib)):
        assert decimal - 1 - PRINTED < whole <= decimal + PRINTED
    assert host.weights_mib == tensor_bytes(SHAPES["mid"]) // MiB


def test_repacked_weights_are_their_own_row_in_the_breakdown(llama_server, model_path):
    run = run_server(server_argv(llama_server, model_path("q4"), ctx=512, parallel=1))
    assert "CPU_REPACK" in read_memory(run.lines).devices
    assert "CPU_REPACK" in read_memory([line for line in run.lines if '"fit_memory_breakdown"' in line]).devices
