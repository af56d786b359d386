"""What llama-server holds on each card, by llama.cpp's own rules (the build `make llama-server` makes).

- Weights (`--split-mode layer`, src/llama-model.cpp load_tensors): the input layer stays on the host;
  repeating layer il, and the output layer as layer n_layer, go to the card
  upper_bound(cumulative split, il / (n_layer + 1)), in float32 as llama.cpp computes it. board always
  passes --tensor-split, so the split predicted here is the split that happens.
- KV cache (src/llama-context.cpp, llama-kv-cache.cpp, llama-kv-cache-iswa.cpp): n_ctx = pad256(ctx);
  with -np N, not unified, N streams of pad256(n_ctx / N) cells; unified, one stream of n_ctx cells. Each
  layer holds n_stream x cells x (row(type_k, n_embd_k_gqa) + row(type_v, n_embd_v_gqa)) on its card.
  Sliding-window layers keep pad256(min(cells, n_swa x (N if unified else 1) + n_ubatch)) cells. Without
  flash attention V is transposed and each layer's V row is as wide as the widest layer's.
- Compute buffers: graph.py replays the scheduler's reservation.
- Each card also carries a fixed overhead (the CUDA context, cuBLAS workspaces): [fit] overhead_mib.
"""

from __future__ import annotations

import struct
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

from app.core.request import MAX_PARALLEL
from app.errors import BadInput
from app.fit import graph
from app.fit.gguf_model import Model

MIB = 1 << 20
PAD = 256
CARD_COUNTS = (1, 2, 4, 8)
# bytes per block and elements per block (ggml's type traits)
CACHE_TYPES = {"f32": (4, 1), "f16": (2, 1), "bf16": (2, 1), "q8_0": (34, 32), "q4_0": (18, 32), "q4_1": (20, 32),
               "q5_0": (22, 32), "q5_1": (24, 32), "iq4_nl": (18, 32)}


@dataclass(frozen=True)
class Settings:
    ctx: int = 4096
    parallel: int = 1
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    flash_attn: bool = True
    unified: bool = False
    ubatch: int = 512
    batch: int = 2048

    def check(self, model: Model) -> None:
        """BadInput where llama.cpp would refuse these settings for this model."""
        if self.ctx < 1:
            raise BadInput(f"--ctx must be at least 1 token, not {self.ctx}")
        if self.parallel < 1:
            raise BadInput(f"--parallel must be at least 1, not {self.parallel}")
        if self.parallel > MAX_PARALLEL:
            raise BadInput(f"--parallel must be at most {MAX_PARALLEL} (llama.cpp's limit), not {self.parallel}")
        for which, name in (("k", self.cache_type_k), ("v", self.cache_type_v)):
            if name not in CACHE_TYPES:
                raise BadInput(f"--cache-type-{which} {name!r} is not a cache type; use one of {', '.join(CACHE_TYPES)}")
            block = CACHE_TYPES[name][1]
            head = model.head_k if which == "k" else model.head_v
            if self.flash_attn and head % block:
                raise BadInput(f"--cache-type-{which} {name} with flash attention needs a head size that is a multiple "
                               f"of {block}; this model's is {head} (llama.cpp refuses it)")
            widths = {head * n for n in model.n_head_kv}
            if bad := sorted(w for w in widths if w % block):
                raise BadInput(f"--cache-type-{which} {name} needs K/V rows that are a multiple of {block} wide; "
                               f"this model's are {bad[0]}")
        if _quantised(self.cache_type_v) and not self.flash_attn:
            raise BadInput(f"a {self.cache_type_v} V cache needs flash attention (--flash-attn on), as llama.cpp requires")

    def cells(self) -> tuple[int, int]:
        """(streams, cells per stream) of the full-attention cache."""
        n_ctx = _pad(self.ctx)
        if self.unified:
            return 1, n_ctx
        return self.parallel, _pad(n_ctx // self.parallel)

    @property
    def n_ubatch(self) -> int:
        """llama_context caps the batch by the context before it pads the context to 256."""
        return min(self.ctx, self.batch, self.ubatch)

    def as_dict(self) -> dict:
        return {"ctx": self.ctx, "parallel": self.parallel, "cache_type_k": self.cache_type_k,
                "cache_type_v": self.cache_type_v, "flash_attn": self.flash_attn, "unified": self.unified}


@dataclass(frozen=True)
class CardUse:
    weights_mib: float
    kv_mib: float
    compute_mib: float
    overhead_mib: float

    @property
    def total_mib(self) -> float:
        return self.weights_mib + self.kv_mib + self.compute_mib + self.overhead_mib

    def as_dict(self) -> dict:
        return {"weights_mib": round(self.weights_mib, 1), "kv_mib": round(self.kv_mib, 1),
                "compute_mib": round(self.compute_mib, 1), "overhead_mib": round(self.overhead_mib, 1),
                "total_mib": round(self.total_mib, 1)}


@dataclass(frozen=True)
class Placement:
    """One way to run the model: a number of cards, what each holds, and what stays on the host."""
    cards: int
    per_card: tuple[CardUse, ...]
    host_weights_mib: float
    host_compute_mib: float
    fits: bool
    limit_mib: float

    @property
    def host_mib(self) -> float:
        return self.host_weights_mib + self.host_compute_mib

    def as_dict(self) -> dict:
        return {"cards": self.cards, "per_card": [c.as_dict() for c in self.per_card], "fits": self.fits}


def _pad(n: int) -> int:
    return -(-n // PAD) * PAD


def _quantised(cache_type: str) -> bool:
    return CACHE_TYPES[cache_type][1] > 1


def row_bytes(cache_type: str, n: int) -> int:
    size, block = CACHE_TYPES[cache_type]
    return n // block * size


def _f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def layer_cards(n_layer: int, split: Sequence[float]) -> list[int]:
    """The card of each layer 0..n_layer (the last is the output layer), as llama.cpp assigns them."""
    points, total = [], _f32(0.0)
    for share in split:
        total = _f32(total + _f32(share))
        points.append(total)
    points = [_f32(p / total) for p in points]
    units = n_layer + 1
    return [min(bisect_right(points, _f32(_f32(il) / units)), len(split) - 1) for il in range(units)]


def kv_bytes_per_layer(model: Model, settings: Settings) -> list[int]:
    streams, cells = settings.cells()
    swa_cells = _pad(min(cells, model.n_swa * (settings.parallel if settings.unified else 1) + settings.n_ubatch))
    # Without flash attention V is stored transposed, every layer as wide as the widest (llama_kv_cache).
    v_max = max(model.n_embd_v_gqa(il) for il in range(model.n_layer))
    sizes = []
    for il in range(model.n_layer):
        v_width = model.n_embd_v_gqa(il) if settings.flash_attn else v_max
        row = row_bytes(settings.cache_type_k, model.n_embd_k_gqa(il)) + row_bytes(settings.cache_type_v, v_width)
        sizes.append(streams * (swa_cells if model.swa[il] else cells) * row)
    return sizes


def _rotation(cache_type: str, head: int, *, grow: bool) -> int:
    """The Hadamard block llama.cpp rotates a quantised cache's heads by (llama_kv_cache's attn_rot_k/v)."""
    if not _quantised(cache_type) or head % 64:
        return 0
    n = 64
    while grow and head % (2 * n) == 0:
        n *= 2
    return n


def graph_shape(model: Model, settings: Settings) -> graph.Shape:
    streams, cells = settings.cells()
    n_tokens = min(_pad(settings.ctx), settings.n_ubatch)
    swa_cells = _pad(min(cells, model.n_swa * (settings.parallel if settings.unified else 1) + settings.n_ubatch))
    return graph.Shape(
        n_embd=model.n_embd, n_vocab=model.n_vocab, n_head=model.n_head, n_head_kv=model.n_head_kv, n_ff=model.n_ff,
        head_k=model.head_k, head_v=model.head_v, swa=model.swa, n_expert=model.n_expert,
        n_expert_used=model.n_expert_used, n_tokens=n_tokens, n_outputs=min(n_tokens, settings.parallel),
        n_kv=cells, n_kv_swa=swa_cells, n_stream=streams, flash_attn=settings.flash_attn,
        rot_k=_rotation(settings.cache_type_k, model.head_k, grow=True),
        rot_v=_rotation(settings.cache_type_v, model.head_v, grow=False),
    )


def place(model: Model, settings: Settings, cards: int, *, card_mib: float, overhead_mib: float, max_fill: float,
          split: Sequence[float] | None = None) -> Placement:
    """The memory on each of `cards` GPUs (an even --tensor-split unless `split` says otherwise)."""
    settings.check(model)
    owners = layer_cards(model.n_layer, split or [1.0] * cards)
    weights = [0] * cards
    kv = [0] * cards
    for il, size in enumerate(model.layer_bytes):
        weights[owners[il]] += size
    weights[owners[-1]] += model.output_bytes
    for il, size in enumerate(kv_bytes_per_layer(model, settings)):
        kv[owners[il]] += size
    layers = [[il for il in range(model.n_layer) if owners[il] == card] for card in range(cards)]
    compute, host_compute = graph.compute_bytes(graph_shape(model, settings), layers, owners[-1], gpu=True)
    per_card = tuple(CardUse(weights[c] / MIB, kv[c] / MIB, compute[c] / MIB, overhead_mib) for c in range(cards))
    limit = card_mib * max_fill
    return Placement(cards, per_card, model.input_bytes / MIB, host_compute / MIB,
                     all(c.total_mib <= limit for c in per_card), limit)


def cpu_totals(model: Model, settings: Settings) -> dict[str, float]:
    """The figures a CPU-only llama-server reports (one device: weights, KV and compute all on the host):
    what the accuracy tests compare with llama.cpp's own log."""
    settings.check(model)
    layers = [list(range(model.n_layer))]
    compute, _ = graph.compute_bytes(graph_shape(model, settings), layers, 0, gpu=False)
    return {"weights_mib": model.tensor_bytes / MIB,
            "kv_mib": sum(kv_bytes_per_layer(model, settings)) / MIB,
            "compute_mib": compute[0] / MIB}
