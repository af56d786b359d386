"""app.fit.graph beyond the shapes llama-server was measured on (tests/unit/test_fit.py): hand-worked peaks, and the
replay's figures pinned at the edges of each of its rules.

The pinned figures are what the replay gives today; llama-server's own figures for the CPU build check the replay in
test_fit.py (MEASURED) and tests/fit/test_accuracy.py. These pin every branch of the graph besides, which the measured
shapes do not reach: the MoE experts, a rotated V cache, several streams with a window, an output layer on a card of
its own, the scheduler's four copies and the host's buffer, and shapes where one tensor dominates (a wide residual
stream, a router of 512 experts, heads of 512). Each case was chosen because some plausible slip in a rule changes its
figure (make mutation); a deliberate change to a rule re-pins them, with the reason in the commit.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from app.fit.graph import Allocator, Graph, Shape, compute_bytes, reserve

SMALL = Shape(n_embd=64, n_vocab=100, n_head=(2, 2), n_head_kv=(1, 1), n_ff=(16, 16), head_k=32, head_v=32,
              swa=(False, False), n_expert=0, n_expert_used=0, n_tokens=8, n_outputs=2, n_kv=256, n_kv_swa=256,
              n_stream=1, flash_attn=True, rot_k=0, rot_v=0)


def test_an_output_card_without_layers_holds_the_norm_of_the_output_rows():
    # Two layers and the output over three cards: card 2 holds no layer, only the output layer. In blocks of 128:
    # the residual stream's 4 copies (64 x 8 floats, 2,048 each), 4 each of pos, k_idxs and v_idxs (one block each)
    # and of the mask (256 x 8 halves, 4,096 each), and out_ids (one block each): 26,624. Then the output norm of
    # the 2 output rows (64 x 2 floats: 512), the weight in place, and the logits (100 x 2 floats: 896) in the hole
    # of the first copy, which the norm was its last reader: 27,136. (It was sized by out_ids' last copy: 26,752.)
    per_card, _ = compute_bytes(SMALL, [[0], [1], [], []], 2, gpu=True)
    assert per_card[2] == 27_136
    assert per_card[3] == 4 * 2_048  # a card with neither layers nor the output: the stream's copies alone


def test_one_gpu_takes_no_copies_of_the_inputs():
    one, _ = compute_bytes(SMALL, [[0, 1]], 0, gpu=True)
    (two, _), _ = compute_bytes(SMALL, [[0, 1], []], 0, gpu=True)
    # with a second card the scheduler keeps 4 copies of each input: 3 more of the stream, pos, the indices, the
    # mask and out_ids (2,048 + 4 x 128 + 4,096 + 128 each)
    assert two - one[0] == 3 * (2_048 + 3 * 128 + 4_096 + 128)


def test_without_flash_attention_the_scores_are_the_peak():
    narrow = Shape(n_embd=8, n_vocab=10, n_head=(16,), n_head_kv=(1,), n_ff=(8,), head_k=8, head_v=8, swa=(False,),
                   n_expert=0, n_expert_used=0, n_tokens=512, n_outputs=1, n_kv=4096, n_kv_swa=256, n_stream=1,
                   flash_attn=False, rot_k=0, rot_v=0)
    mib = 1 << 20
    # 16 heads' scores of 512 tokens over 4,096 cells (128 MiB of floats) beside the mask, in F32 (8 MiB)
    (scores,), _ = compute_bytes(narrow, [[0]], 0, gpu=False)
    assert 4096 * 512 * 16 * 4 + 4096 * 512 * 4 <= scores < 4096 * 512 * 16 * 4 + 4096 * 512 * 4 + mib
    # flash attention keeps no scores: the mask, in F16 (4 MiB), is the largest tensor
    (flash,), _ = compute_bytes(replace(narrow, flash_attn=True), [[0]], 0, gpu=False)
    assert 4096 * 512 * 2 <= flash < 4096 * 512 * 2 + mib
    # 3 streams of 100 tokens: 33 rows each, 99 in all, are scored and masked (not 100)
    (streams,), _ = compute_bytes(replace(narrow, n_tokens=100, n_stream=3), [[0]], 0, gpu=False)
    assert 4096 * 99 * 16 * 4 + 4096 * 99 * 4 <= streams < 4096 * 100 * 16 * 4 + 4096 * 100 * 4


def test_a_graph_of_views_reserves_nothing():
    g = Graph()
    g.add("view", 0)
    assert reserve(g, 32) == 0
    assert Allocator(32).high == 0


# (name, Shape fields other than BASE's, layers per device, output device, gpu, bytes per device, host bytes)
BASE = Shape(n_embd=96, n_vocab=1000, n_head=(4, 4, 4), n_head_kv=(2, 2, 2), n_ff=(160, 160, 160), head_k=24, head_v=40,
             swa=(False, False, False), n_expert=0, n_expert_used=0, n_tokens=512, n_outputs=3, n_kv=1024, n_kv_swa=768,
             n_stream=1, flash_attn=True, rot_k=0, rot_v=0)
PINNED = [
    ("moe_nofa/gpu3_idle_out",
     dict(n_expert=8, n_expert_used=3, flash_attn=False),
     [[0, 1], [2], []], 2, True, [19488768, 19489280, 10512000], 991232),
    ("rot/cpu",
     dict(rot_k=64, rot_v=32),
     [[0, 1, 2]], 0, False, [3053600], 0),
    ("bigvocab/gpu1",
     dict(n_vocab=50000, n_outputs=64),
     [[0, 1, 2]], 0, True, [12824576], 991232),
    ("moe/cpu",
     dict(n_ff=(64, 64, 64), n_expert=8, n_expert_used=2),
     [[0, 1, 2]], 0, False, [3164192], 0),
    ("swa/gpu4_idle",
     dict(swa=(True, False, True)),
     [[0], [], [1, 2], []], 2, True, [8888320, 786432, 8888832, 786432], 991232),
    ("streams_nofa/cpu",
     dict(n_tokens=100, n_kv=512, n_stream=3, flash_attn=False),
     [[0, 1, 2]], 0, False, [1374400], 0),
    ("rot_nofa/gpu2",
     dict(flash_attn=False, rot_k=64),
     [[0, 1], [2]], 1, True, [19357696, 19358208], 991232),
    ("swa_nofa/gpu3_idle_out",
     dict(swa=(True, False, True), flash_attn=False),
     [[0, 1], [2], []], 2, True, [26517504, 25010688, 10512000], 991232),
    ("rotv/gpu2",
     dict(rot_v=64),
     [[0, 1], [2]], 1, True, [6266880, 5841408], 991232),
    ("rot/gpu2",
     dict(rot_k=64, rot_v=32),
     [[0, 1], [2]], 1, True, [6283264, 5825024], 991232),
    ("perlayer_nofa/cpu",
     dict(n_head=(4, 6, 2), n_head_kv=(1, 3, 2), n_ff=(160, 96, 224), flash_attn=False),
     [[0, 1, 2]], 0, False, [16758816], 0),
    ("moe_nofa/gpu1",
     dict(n_expert=8, n_expert_used=3, flash_attn=False),
     [[0, 1, 2]], 0, True, [11606144], 991232),
    ("wide/gpu2b",
     dict(n_embd=1024, n_ff=(64, 64, 64)),
     [[0], [1, 2]], 1, True, [15212544, 17146368], 10493952),
    ("allout/gpu2b",
     dict(n_outputs=512),
     [[0], [1, 2]], 1, True, [5709824, 7077888], 991232),
    ("moe_router_out/gpu1",
     dict(n_embd=32, n_ff=(4, 4, 4), head_k=4, head_v=4, n_expert=512, n_expert_used=1, n_outputs=512, n_kv=256),
     [[0, 1, 2]], 0, True, [2179072], 335872),
    ("hk_rot/gpu2b",
     dict(head_k=512, head_v=4, n_kv=256, rot_k=128, rot_v=64),
     [[0], [1, 2]], 1, True, [10821632, 10822144], 991232),
    ("moe_down_few/gpu4_idle",
     dict(n_embd=1024, n_ff=(4, 4, 4), head_k=4, head_v=4, n_expert=8, n_expert_used=8, n_tokens=5, n_outputs=1,
          n_kv=256, n_stream=2),
     [[0], [], [1, 2], []], 2, True, [276352, 81920, 277376, 81920], 102528),
    ("hk_few/gpu2b",
     dict(head_k=512, head_v=4, n_tokens=5, n_outputs=1, n_kv=256, n_stream=2),
     [[0], [1, 2]], 1, True, [101248, 101760], 9728),
    ("moe_router_few/gpu_out_first",
     dict(n_embd=32, n_ff=(4, 4, 4), head_k=4, head_v=4, n_expert=512, n_expert_used=1, n_tokens=5, n_outputs=1,
          n_kv=256, n_stream=2),
     [[0, 1, 2], []], 0, True, [24064, 2560], 3328),
    ("hk_nofa/cpu",
     dict(head_k=512, head_v=4, n_kv=256, flash_attn=False),
     [[0, 1, 2]], 0, False, [10139680], 0),
    ("hv_out/cpu_none",
     dict(head_k=4, head_v=512, n_outputs=512, n_kv=256),
     [[]], 0, False, [3313664], 0),
    ("one-token-moe-window-rotated",
     dict(n_embd=8, n_head=(2,), n_head_kv=(1,), n_ff=(4096,), head_k=64, head_v=16, swa=(True,), n_expert=16,
          n_expert_used=4, n_tokens=1, n_outputs=1, n_kv=512, n_kv_swa=256, n_stream=3, rot_k=256, rot_v=64),
     [[], [0]], 1, True, [512, 1119104], 192),
    ("one-token-four-streams-no-fa",
     dict(n_embd=8, n_vocab=50000, n_head=(4, 4, 2), n_head_kv=(2, 1, 1), n_ff=(4, 512, 4), head_k=4, head_v=4,
          n_tokens=1, n_outputs=1, n_kv=4096, n_stream=4, flash_attn=False),
     [[0, 1, 2]], 0, False, [200160], 0),
    ("moe-output-on-a-card-of-its-own",
     dict(n_head=(4, 4, 8), n_head_kv=(1, 4, 2), n_ff=(4, 64, 4), head_k=256, head_v=4, n_expert=16, n_expert_used=1,
          n_tokens=1, n_outputs=1, n_kv=512, n_kv_swa=300, rot_v=128),
     [[], [], [0, 1, 2], []], 3, True, [1536, 1536, 286592, 273920], 2016),
    ("one-layer-moe-no-fa-rotated",
     dict(n_embd=8, n_vocab=50000, n_head=(1,), n_head_kv=(1,), n_ff=(4096,), head_k=64, head_v=4, swa=(False,),
          n_expert=4, n_expert_used=2, n_tokens=1, n_outputs=1, n_kv=512, n_kv_swa=300, n_stream=4, flash_attn=False,
          rot_k=64, rot_v=64),
     [[0]], 0, False, [298592], 0),
    ("wide-stream-three-tokens-window",
     dict(n_embd=1024, n_vocab=50000, n_head=(8, 8), n_head_kv=(4, 8), n_ff=(512, 16), head_k=16, head_v=4, swa=(False,
          True), n_tokens=3, n_kv=256, n_kv_swa=300, n_stream=4, rot_k=64, rot_v=64),
     [[0, 1]], 0, True, [658176], 61536),
    ("300-experts-wide-v-heads",
     dict(n_embd=32, n_vocab=50000, n_head=(1, 1), n_head_kv=(1, 1), n_ff=(64, 512), head_k=16, head_v=256, swa=(False,
          True), n_expert=300, n_expert_used=2, n_tokens=1, n_outputs=1, n_kv=4096, n_kv_swa=256, n_stream=3, rot_k=64),
     [[], [], [0, 1], []], 2, True, [512, 512, 269184, 512], 736),
    ("router-wider-than-the-stream",
     dict(n_embd=8, n_vocab=100, n_head=(4,), n_head_kv=(4,), n_ff=(512,), head_k=16, head_v=64, swa=(True,),
          n_expert=300, n_expert_used=1, n_tokens=3, n_outputs=1, n_kv=4096, n_stream=4),
     [[0]], 0, True, [8192], 576),
    ("moe-window-rotated-k-cpu",
     dict(n_vocab=100, n_head=(2, 2), n_head_kv=(1, 1), n_ff=(64, 4), head_k=4, head_v=16, swa=(False, True),
          n_expert=16, n_expert_used=1, n_kv=4096, n_kv_swa=300, n_stream=4, rot_k=256),
     [[0, 1]], 0, False, [5773344], 0),
]


@pytest.mark.parametrize(("name", "fields", "devices", "output_device", "gpu", "per_device", "host"), PINNED,
                         ids=[case[0] for case in PINNED])
def test_the_replays_figures(name, fields, devices, output_device, gpu, per_device, host):
    assert compute_bytes(replace(BASE, **fields), devices, output_device, gpu=gpu) == (per_device, host)
