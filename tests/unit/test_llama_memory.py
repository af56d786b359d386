"""app.llama.memory reads llama.cpp's memory figures from a server log.

The CPU lines are captured from the real llama-server of this build (tests/fit/runner.py, `-lv 4 --log-jsonl`,
or plain -lv 4 / -v on stderr); the GPU lines are made from the same format strings (src/llama-model.cpp,
llama-kv-cache.cpp, llama-context.cpp; common/fit.cpp for the breakdown) with the buffer names a CUDA build uses.
"""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from app.llama.memory import DeviceMemory, KvCache, Measured, read_memory

# tiny (tests/llama/tiny_gguf.py), -c 2048 -np 2, --log-jsonl: the --fit projection, the load, then the exit breakdown.
TINY_JSONL = r"""
{"type":"log","time":11336,"level":"info","msg":"common_memory_breakdown_print: | memory breakdown [MiB] | total   free    self   model   context   compute    unaccounted |\n"}
{"type":"log","time":11360,"level":"info","msg":"common_memory_breakdown_print: |   - Host               |                    3 =     0 +       0 +       2                |\n"}
{"type":"fit_memory_breakdown","data":{"unit":"MiB","rows":[{"kind":"host","name":"Host","self":3,"model":0,"context":0,"compute":2}]}}
{"type":"log","time":12316,"level":"info","msg":"print_info: file size   = 0.41 MiB (32.00 BPW) \n"}
{"type":"log","time":12821,"level":"info","msg":"load_tensors: loading model tensors, this can take a while... (load_mode = mmap)\n"}
{"type":"log","time":13183,"level":"info","msg":"load_tensors:   CPU_Mapped model buffer size =     0.41 MiB\n"}
{"type":"log","time":13407,"level":"info","msg":"llama_context: n_seq_max             = 2\n"}
{"type":"log","time":13408,"level":"info","msg":"llama_context: n_ctx                 = 2048\n"}
{"type":"log","time":13408,"level":"info","msg":"llama_context: n_ctx_seq             = 1024\n"}
{"type":"log","time":13414,"level":"info","msg":"llama_context: n_ctx_seq (1024) < n_ctx_train (2048) -- the full capacity of the model will not be utilized\n"}
{"type":"log","time":13420,"level":"info","msg":"llama_context:        CPU  output buffer size =     0.00 MiB\n"}
{"type":"log","time":13461,"level":"info","msg":"llama_kv_cache:        CPU KV buffer size =     0.50 MiB\n"}
{"type":"log","time":13764,"level":"info","msg":"llama_kv_cache: size =    0.50 MiB (  1024 cells,   2 layers,  2/2 seqs), K (f16):    0.25 MiB, V (f16):    0.25 MiB\n"}
{"type":"log","time":13784,"level":"info","msg":"sched_reserve: reserving ...\n"}
{"type":"log","time":15472,"level":"info","msg":"sched_reserve:        CPU compute buffer size =     2.14 MiB\n"}
{"type":"log","time":15474,"level":"info","msg":"sched_reserve: graph: nodes = 75, splits = 1, input objects = 4, input tensors = 9\n"}
{"type":"log","time":22164,"level":"info","msg":"srv  llama_server: listening on http://127.0.0.1:28111\n"}
{"type":"log","time":9995362,"level":"info","msg":"common_memory_breakdown_print: | memory breakdown [MiB] | total   free    self   model   context   compute    unaccounted |\n"}
{"type":"fit_memory_breakdown","data":{"unit":"MiB","rows":[{"kind":"host","name":"Host","self":3,"model":0,"context":0,"compute":2}]}}
""".strip().splitlines()  # noqa: E501 (lines as llama.cpp wrote them)

# The same model without --log-jsonl, -c 2048 -np 1, as stderr prints it.
TINY_PLAIN = """\
0.00.013.845 I common_memory_breakdown_print: |   - Host               |                    4 =     0 +       0 +       3                |
0.00.015.641 I load_tensors:   CPU_Mapped model buffer size =     0.41 MiB
0.00.015.904 I llama_context:        CPU  output buffer size =     0.00 MiB
0.00.015.947 I llama_kv_cache:        CPU KV buffer size =     0.50 MiB
0.00.016.322 I llama_kv_cache: size =    0.50 MiB (  2048 cells,   2 layers,  1/1 seqs), K (f16):    0.25 MiB, V (f16):    0.25 MiB
0.00.018.085 I sched_reserve:        CPU compute buffer size =     3.14 MiB
""".splitlines()  # noqa: E501 (lines as llama.cpp wrote them)

# -v: the --fit dry run (no_alloc: empty model and KV buffers) logs its own figures before the real load's.
TINY_VERBOSE = """\
0.00.015.072 I llama_model_loader: loaded meta data with 21 key-value pairs and 21 tensors from tiny.gguf (version GGUF V3 (latest))
0.00.017.631 I load_tensors:          CPU model buffer size =     0.00 MiB
0.00.017.689 I llama_context: n_ctx                 = 2048
0.00.017.689 I llama_context: n_ctx_seq             = 1024
0.00.017.703 I llama_context:        CPU  output buffer size =     0.00 MiB
0.00.017.869 I llama_kv_cache:        CPU KV buffer size =     0.00 MiB
0.00.017.873 I llama_kv_cache: size =    0.50 MiB (  1024 cells,   2 layers,  2/2 seqs), K (f16):    0.25 MiB, V (f16):    0.25 MiB
0.00.017.879 I sched_reserve: reserving ...
0.00.018.318 D sched_reserve: reserving full memory module
0.00.022.430 I sched_reserve:        CPU compute buffer size =     2.14 MiB
0.00.023.018 I common_memory_breakdown_print: |   - Host               |                    3 =     0 +       0 +       2                |
0.00.023.532 I llama_model_loader: loaded meta data with 21 key-value pairs and 21 tensors from tiny.gguf (version GGUF V3 (latest))
0.00.025.683 I load_tensors:   CPU_Mapped model buffer size =     0.41 MiB
0.00.026.016 I llama_context: n_ctx                 = 2048
0.00.026.037 I llama_context: n_ctx_seq             = 1024
0.00.026.225 I llama_context:        CPU  output buffer size =     0.00 MiB
0.00.026.271 I llama_kv_cache:        CPU KV buffer size =     0.50 MiB
0.00.026.674 I llama_kv_cache: size =    0.50 MiB (  1024 cells,   2 layers,  2/2 seqs), K (f16):    0.25 MiB, V (f16):    0.25 MiB
0.00.026.681 I sched_reserve: reserving ...
0.00.028.375 I sched_reserve:        CPU compute buffer size =     2.14 MiB
0.00.038.228 I srv  llama_server: listening on http://127.0.0.1:28112
0.04.992.773 I common_memory_breakdown_print: |   - Host               |                    3 =     0 +       0 +       2                |
0.04.992.857 D ~llama_context:        CPU compute buffer size is   2.1426 MiB, matches expectation of   2.1426 MiB
""".splitlines()  # noqa: E501 (lines as llama.cpp wrote them)

# tests/fit/shapes.py "swa" (gemma2, window 256), -c 2048 -np 2: a full cache and a windowed one.
SWA_PLAIN = """\
0.00.013.754 I load_tensors:   CPU_Mapped model buffer size =     2.39 MiB
0.00.014.058 I llama_context:        CPU  output buffer size =     0.00 MiB
0.00.014.061 I llama_kv_cache_iswa: creating non-SWA KV cache, size = 1024 cells
0.00.014.110 I llama_kv_cache:        CPU KV buffer size =     1.00 MiB
0.00.014.946 I llama_kv_cache: size =    1.00 MiB (  1024 cells,   2 layers,  2/2 seqs), K (f16):    0.50 MiB, V (f16):    0.50 MiB
0.00.014.950 I llama_kv_cache_iswa: creating     SWA KV cache, size = 768 cells
0.00.014.987 I llama_kv_cache:        CPU KV buffer size =     0.75 MiB
0.00.015.610 I llama_kv_cache: size =    0.75 MiB (   768 cells,   2 layers,  2/2 seqs), K (f16):    0.38 MiB, V (f16):    0.38 MiB
0.00.015.616 I sched_reserve: reserving ...
0.00.018.860 I sched_reserve:        CPU compute buffer size =     4.53 MiB
""".splitlines()  # noqa: E501 (lines as llama.cpp wrote them)

# "q4" (Q4_0 weights), -c 512 -np 1: the CPU repacks Q4_0 weights into a buffer of their own.
Q4_JSONL = r"""
{"type":"fit_memory_breakdown","data":{"unit":"MiB","rows":[{"kind":"host","name":"Host","self":8,"model":0,"context":0,"compute":8},{"kind":"buffer_type","name":"CPU_REPACK","self":0,"model":0,"context":0,"compute":0}]}}
{"type":"log","time":14903,"level":"info","msg":"load_tensors:   CPU_Mapped model buffer size =     0.67 MiB\n"}
{"type":"log","time":14905,"level":"info","msg":"load_tensors:   CPU_REPACK model buffer size =     0.60 MiB\n"}
{"type":"log","time":16088,"level":"info","msg":"llama_context:        CPU  output buffer size =     0.00 MiB\n"}
{"type":"log","time":16123,"level":"info","msg":"llama_kv_cache:        CPU KV buffer size =     0.25 MiB\n"}
{"type":"log","time":16363,"level":"info","msg":"llama_kv_cache: size =    0.25 MiB (   512 cells,   2 layers,  1/1 seqs), K (f16):    0.12 MiB, V (f16):    0.12 MiB\n"}
{"type":"log","time":16370,"level":"info","msg":"sched_reserve: reserving ...\n"}
{"type":"log","time":18345,"level":"info","msg":"sched_reserve:        CPU compute buffer size =     8.26 MiB\n"}
""".strip().splitlines()  # noqa: E501 (lines as llama.cpp wrote them)

# "gqa8", -c 3000 -np 4 -kvu -ctk q8_0 -ctv q4_0 -fa on: one stream for four sequences; the exit breakdown.
GQA8_QUANTISED_JSONL = r"""
{"type":"log","time":15599,"level":"info","msg":"load_tensors:   CPU_Mapped model buffer size =     8.26 MiB\n"}
{"type":"log","time":15864,"level":"info","msg":"llama_context: n_ctx                 = 3072\n"}
{"type":"log","time":15865,"level":"info","msg":"llama_context: n_ctx_seq             = 3072\n"}
{"type":"log","time":15918,"level":"info","msg":"llama_kv_cache:        CPU KV buffer size =     4.88 MiB\n"}
{"type":"log","time":20464,"level":"info","msg":"llama_kv_cache: size =    4.88 MiB (  3072 cells,   4 layers,  4/1 seqs), K (q8_0):    3.19 MiB, V (q4_0):    1.69 MiB\n"}
{"type":"log","time":23445,"level":"info","msg":"sched_reserve:        CPU compute buffer size =     9.60 MiB\n"}
{"type":"fit_memory_breakdown","data":{"unit":"MiB","rows":[{"kind":"host","name":"Host","self":22,"model":8,"context":4,"compute":9}]}}
""".strip().splitlines()  # noqa: E501 (lines as llama.cpp wrote them)

# A partly offloaded model on a CUDA build, from the format strings (figures made up).
GPU_PLAIN = """\
load_tensors:        CUDA0 model buffer size =  3895.11 MiB
load_tensors:   CPU_Mapped model buffer size =   410.98 MiB
llama_context:  CUDA_Host  output buffer size =     0.58 MiB
llama_kv_cache:      CUDA0 KV buffer size =  1024.00 MiB
llama_kv_cache: size = 1024.00 MiB (  8192 cells,  32 layers,  1/1 seqs), K (f16):  512.00 MiB, V (f16):  512.00 MiB
sched_reserve: reserving ...
sched_reserve:      CUDA0 compute buffer size =   560.00 MiB
sched_reserve:  CUDA_Host compute buffer size =    24.01 MiB
""".splitlines()  # noqa: E501 (lines as llama.cpp wrote them)

GPU_BREAKDOWN = json.dumps({"type": "fit_memory_breakdown", "data": {"unit": "MiB", "rows": [
    {"kind": "device", "name": "CUDA0", "description": "RTX 5090", "total": 32109, "free": 26000, "self": 5479,
     "model": 3895, "context": 1024, "compute": 560, "unaccounted": 630},
    {"kind": "host", "name": "Host", "self": 435, "model": 410, "context": 0, "compute": 24},
    {"kind": "buffer_type", "name": "CPU_REPACK", "self": 12, "model": 12, "context": 0, "compute": 0},
]}})


def test_a_jsonl_log_gives_each_buffer_in_decimal_mib():
    measured = read_memory(TINY_JSONL)
    assert measured.source == "lines"
    assert measured.devices == {"CPU_Mapped": DeviceMemory(weights_mib=0.41), "CPU": DeviceMemory(kv_mib=0.5, compute_mib=2.14)}
    assert (measured.kv_cells, measured.kv_seqs, measured.n_ctx, measured.n_ctx_seq) == (1024, 2, 2048, 1024)
    assert measured.kv_caches == (KvCache(0.5, 1024, 2, 2, 2, "f16", "f16", 0.25, 0.25),)
    assert (measured.weights_mib, measured.kv_mib, measured.compute_mib) == (0.41, 0.5, 2.14)


def test_plain_lines_with_llama_cpp_prefixes_read_the_same():
    measured = read_memory(TINY_PLAIN)
    assert measured.source == "lines"
    assert measured.devices == {"CPU_Mapped": DeviceMemory(weights_mib=0.41), "CPU": DeviceMemory(kv_mib=0.5, compute_mib=3.14)}
    assert (measured.kv_cells, measured.kv_seqs) == (2048, 1)


def test_lines_read_from_a_file_keep_their_newlines(tmp_path):
    log = tmp_path / "1.log"
    log.write_text("\n".join(TINY_JSONL) + "\n")
    with open(log) as lines:
        assert read_memory(lines) == read_memory(TINY_JSONL)


def test_the_fit_dry_run_before_the_load_is_not_counted():
    measured = read_memory(TINY_VERBOSE)
    assert measured.devices == {"CPU_Mapped": DeviceMemory(weights_mib=0.41), "CPU": DeviceMemory(kv_mib=0.5, compute_mib=2.14)}
    assert len(measured.kv_caches) == 1


def test_a_second_reserve_replaces_the_compute_figures():
    again = ["sched_reserve: reserving ...", "sched_reserve:        CPU compute buffer size =     3.00 MiB"]
    assert read_memory(TINY_PLAIN + again).devices["CPU"] == DeviceMemory(kv_mib=0.5, compute_mib=3.0)


def test_the_destructors_compute_check_is_not_a_figure():
    assert read_memory(TINY_VERBOSE[:-1]) == read_memory(TINY_VERBOSE)


def test_two_kv_caches_add_up_and_both_are_kept():
    measured = read_memory(SWA_PLAIN)
    assert measured.devices["CPU"].kv_mib == 1.75
    assert [(c.cells, c.layers) for c in measured.kv_caches] == [(1024, 2), (768, 2)]
    assert measured.kv_cells == 1024  # the full cache


def test_repacked_weights_are_a_buffer_of_their_own():
    measured = read_memory(Q4_JSONL)
    assert measured.devices["CPU_Mapped"].weights_mib == 0.67
    assert measured.devices["CPU_REPACK"].weights_mib == 0.6
    assert measured.weights_mib == 0.67 + 0.6


def test_quantised_caches_and_a_unified_stream():
    measured = read_memory(GQA8_QUANTISED_JSONL)
    assert measured.source == "lines"
    assert measured.kv_caches == (KvCache(4.88, 3072, 4, 4, 1, "q8_0", "q4_0", 3.19, 1.69),)
    assert (measured.kv_cells, measured.kv_seqs, measured.n_ctx) == (3072, 4, 3072)


def test_gpu_buffers_are_named_as_llama_cpp_names_them():
    measured = read_memory(GPU_PLAIN)
    assert measured.devices == {
        "CUDA0": DeviceMemory(weights_mib=3895.11, kv_mib=1024.0, compute_mib=560.0),
        "CPU_Mapped": DeviceMemory(weights_mib=410.98),
        "CUDA_Host": DeviceMemory(output_mib=0.58, compute_mib=24.01),
    }


def test_the_breakdown_serves_when_there_are_no_decimal_lines():
    measured = read_memory([GPU_BREAKDOWN])
    assert measured.source == "breakdown"
    assert measured.devices == {"CUDA0": DeviceMemory(3895, 1024, 560), "Host": DeviceMemory(410, 0, 24),
                                "CPU_REPACK": DeviceMemory(12, 0, 0)}


def test_the_last_breakdown_counts():
    lines = [line for line in TINY_JSONL + GQA8_QUANTISED_JSONL if "fit_memory_breakdown" in line]
    assert read_memory(lines).devices == {"Host": DeviceMemory(8, 4, 9)}


def test_the_breakdown_serves_while_the_load_has_not_reached_compute():
    # The --fit projection comes first; a log cut before the compute buffer has only part of the lines.
    cut = TINY_JSONL[:TINY_JSONL.index(next(line for line in TINY_JSONL if "KV buffer" in line))]
    measured = read_memory(cut)
    assert measured.source == "breakdown"
    assert measured.devices == {"Host": DeviceMemory(0, 0, 2)}
    assert measured.n_ctx == 2048


def test_decimal_lines_win_over_a_later_breakdown():
    assert read_memory(GQA8_QUANTISED_JSONL).source == "lines"
    assert read_memory(GPU_PLAIN + [GPU_BREAKDOWN]).source == "lines"


def test_a_log_without_figures_gives_none():
    default_verbosity = [
        "0.00.011.979 I srv    load_model: loading model 'tiny.gguf'",
        "0.00.342.038 I srv  llama_server: listening on http://127.0.0.1:28114",
    ]
    assert read_memory(default_verbosity) is None
    assert read_memory([]) is None


MALFORMED = [
    "", "{", "[1, 2]", "null", '"text"', '{"type": "log", "msg": 3}', '{"type": "log"}',
    '{"type": "fit_memory_breakdown"}', '{"type": "fit_memory_breakdown", "data": {"unit": "MiB", "rows": 5}}',
    '{"type": "fit_memory_breakdown", "data": {"unit": "GiB", "rows": [{"name": "Host", "model": 1, "context": 1,'
    ' "compute": 1}]}}',
    '{"type": "fit_memory_breakdown", "data": {"unit": "MiB", "rows": [5, {"name": 3}, {"name": "Host", "model": "1",'
    ' "context": 0, "compute": 0}, {"name": "A", "model": -1, "context": 0, "compute": 0}, {"name": "B", "model": true,'
    ' "context": 0, "compute": 0}, {"name": "C", "model": NaN, "context": 0, "compute": 0}, {"name": "D", "model": 1}]}}',
    "load_tensors:   CPU_Mapped model buffer size =     nan MiB",
    "load_tensors:   CPU_Mapped model buffer size = -1.00 MiB",
    "llama_kv_cache: size =    0.50 MiB (  cells,   2 layers,  2/2 seqs), K (f16):    0.25 MiB, V (f16):    0.25 MiB",
    "llama_context: n_ctx                 = many",
]


def test_malformed_lines_are_skipped():
    assert read_memory(MALFORMED) is None
    assert read_memory(['{"type": "fit_memory_breakdown", "data": ' + "[" * 100_000]) is None  # too deep to decode
    assert read_memory(MALFORMED + TINY_PLAIN + MALFORMED) == read_memory(TINY_PLAIN)
    assert read_memory([None, b"bytes", 3] + TINY_PLAIN) == read_memory(TINY_PLAIN)


@given(st.lists(st.one_of(
    st.text(),
    st.sampled_from(TINY_JSONL + TINY_VERBOSE + GPU_PLAIN + MALFORMED + [GPU_BREAKDOWN]),
    st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                 lambda children: st.lists(children) | st.dictionaries(st.text(), children), max_leaves=8)
    .map(lambda data: json.dumps({"type": "fit_memory_breakdown", "data": data})),
)))
def test_no_input_makes_it_raise(lines):
    measured = read_memory(lines)
    assert measured is None or isinstance(measured, Measured)


def test_to_json_is_json_with_rounded_mib_and_reads_back():
    measured = read_memory(SWA_PLAIN)
    data = json.loads(json.dumps(measured.to_json()))
    assert data["source"] == "lines"
    assert data["devices"]["CPU"] == {"weights_mib": 0.0, "kv_mib": 1.75, "compute_mib": 4.53, "output_mib": 0.0}
    assert data["kv_caches"][1] == {"mib": 0.75, "cells": 768, "layers": 2, "seqs": 2, "streams": 2, "type_k": "f16",
                                    "type_v": "f16", "k_mib": 0.38, "v_mib": 0.38}
    assert Measured.from_json(data) == measured


def test_to_json_rounds_sums_to_the_logs_precision():
    lines = ["llama_kv_cache:        CPU KV buffer size =     0.10 MiB"] * 3
    assert read_memory(lines).to_json()["devices"]["CPU"]["kv_mib"] == 0.3


def test_a_breakdown_reads_back_too():
    measured = read_memory([GPU_BREAKDOWN])
    assert Measured.from_json(measured.to_json()) == measured


def test_from_json_refuses_what_to_json_cannot_have_written():
    good = read_memory(SWA_PLAIN).to_json()
    bad = [None, [], {}, {**good, "source": "guess"}, {**good, "devices": []},
           {**good, "devices": {"CPU": {"weights_mib": 1}}},
           {**good, "devices": {"CPU": {**good["devices"]["CPU"], "kv_mib": "1"}}},
           {**good, "kv_cells": -1}, {**good, "kv_cells": 1.5}, {**good, "kv_caches": [{"mib": 1}]}, {**good, "kv_caches": 3},
           {**good, "kv_caches": [{**good["kv_caches"][0], "type_k": 8}]}]
    assert [Measured.from_json(data) for data in bad] == [None] * len(bad)
    assert Measured.from_json(good) is not None
