"""Model shapes for the memory-estimate tests: GGUFs that the real llama-server loads, written with the `gguf` package.

Each shape varies what the estimate depends on: width and head size, grouped-query attention, depth, the vocabulary,
the weights' type, per-layer head counts and a sliding window. The weights are noise (a repeated random block, which
is fast to write); only their shapes and types matter here. `python -m tests.fit.shapes DIR` writes them all.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tests.llama.tiny_gguf import CHATML, CONTROL, TOKENS

# Byte-fallback pieces, the SPM word marker and <unk> <s> </s>: the vocabulary every shape starts from.
BASE_VOCAB = len(TOKENS)


@dataclass(frozen=True)
class Shape:
    """One model's hyperparameters. `n_head_kv` and `n_ff` take a tuple (one per layer) only with arch "deci";
    `head_dim` None means n_embd // n_head; `sliding_window` only with arch "gemma2" (every other layer)."""

    name: str
    arch: str = "llama"
    n_embd: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_head_kv: int | tuple[int, ...] = 2
    head_dim: int | None = None
    n_ff: int | tuple[int, ...] = 128
    n_vocab: int = BASE_VOCAB
    dtype: str = "F32"  # of the 2-D weights: F32, F16, Q8_0 or Q4_0 (norms stay F32)
    tied_output: bool = False  # no output.weight: llama.cpp reuses token_embd (gemma2 always does)
    context_length: int = 4096
    sliding_window: int | None = None

    @property
    def head_size(self) -> int:
        return self.head_dim or self.n_embd // self.n_head

    def heads_kv(self, layer: int) -> int:
        return self.n_head_kv[layer] if isinstance(self.n_head_kv, tuple) else self.n_head_kv

    def ff(self, layer: int) -> int:
        return self.n_ff[layer] if isinstance(self.n_ff, tuple) else self.n_ff

    def n_embd_kv(self, layer: int) -> int:
        """n_embd_k_gqa = n_embd_v_gqa of a layer: what one cell of its K (or V) cache holds."""
        return self.heads_kv(layer) * self.head_size

    def is_swa(self, layer: int) -> bool:
        """gemma2's default pattern (2): layers 0, 2, 4, ... use the window, 1, 3, 5, ... attend in full."""
        return self.sliding_window is not None and layer % 2 == 0


SHAPES: dict[str, Shape] = {shape.name: shape for shape in (
    Shape("tiny"),
    # Head size 128, so q8_0/q4_0 K and V caches are legal (their blocks are 32 wide); heads wider than n_embd / n_head.
    Shape("gqa8", n_embd=256, n_layer=4, n_head=8, n_head_kv=2, head_dim=128, n_ff=512, dtype="F16"),
    Shape("deep", n_embd=128, n_layer=12, n_head=4, n_head_kv=4, n_ff=256, dtype="Q8_0"),
    Shape("q4", n_embd=256, n_layer=2, n_head=4, n_head_kv=1, n_ff=512, dtype="Q4_0"),
    Shape("wide-vocab", n_vocab=100_000, dtype="F16"),
    Shape("tied", n_vocab=4096, tied_output=True),
    # About 100 MB: 4 layers of 1024 wide, F16.
    Shape("mid", n_embd=1024, n_layer=4, n_head=8, n_head_kv=4, n_ff=2816, dtype="F16"),
    # Per-layer KV heads and feed-forward widths (llama.cpp's deci architecture reads both as arrays).
    Shape("per-layer", arch="deci", n_embd=128, n_layer=4, n_head=4, n_head_kv=(4, 2, 1, 2), n_ff=(256, 128, 256, 384)),
    # A sliding window on layers 0 and 2 (gemma2): llama.cpp keeps two KV caches, the windowed one smaller.
    Shape("swa", arch="gemma2", n_embd=128, n_layer=4, n_head=4, n_head_kv=2, head_dim=32, n_ff=256,
          sliding_window=256, context_length=8192),
)}


def vocabulary(n_vocab: int) -> list[str]:
    """The tiny model's byte-level SPM vocabulary, then synthetic word pieces up to n_vocab."""
    if n_vocab < BASE_VOCAB:
        raise ValueError(f"a vocabulary needs at least {BASE_VOCAB} tokens")
    return TOKENS + [f"\u2581w{i}" for i in range(n_vocab - BASE_VOCAB)]


def tensors(shape: Shape) -> Iterator[tuple[str, int, int, str]]:
    """(name, rows, columns, type) of each tensor the model has, in numpy order (rows are outputs); rows 0 for
    the 1-D norms, which are always F32."""
    q_width = shape.n_head * shape.head_size
    yield "token_embd.weight", shape.n_vocab, shape.n_embd, shape.dtype
    for layer in range(shape.n_layer):
        blk = f"blk.{layer}"
        kv_width = shape.n_embd_kv(layer)
        yield f"{blk}.attn_norm.weight", 0, shape.n_embd, "F32"
        yield f"{blk}.attn_q.weight", q_width, shape.n_embd, shape.dtype
        yield f"{blk}.attn_k.weight", kv_width, shape.n_embd, shape.dtype
        yield f"{blk}.attn_v.weight", kv_width, shape.n_embd, shape.dtype
        yield f"{blk}.attn_output.weight", shape.n_embd, q_width, shape.dtype
        yield f"{blk}.ffn_norm.weight", 0, shape.n_embd, "F32"
        yield f"{blk}.ffn_gate.weight", shape.ff(layer), shape.n_embd, shape.dtype
        yield f"{blk}.ffn_up.weight", shape.ff(layer), shape.n_embd, shape.dtype
        yield f"{blk}.ffn_down.weight", shape.n_embd, shape.ff(layer), shape.dtype
        if shape.arch == "gemma2":
            yield f"{blk}.post_attention_norm.weight", 0, shape.n_embd, "F32"
            yield f"{blk}.post_ffw_norm.weight", 0, shape.n_embd, "F32"
    yield "output_norm.weight", 0, shape.n_embd, "F32"
    if not (shape.tied_output or shape.arch == "gemma2"):
        yield "output.weight", shape.n_vocab, shape.n_embd, shape.dtype


def tensor_bytes(shape: Shape) -> int:
    """The tensor data's size in the file: each tensor's bytes, padded to GGUF's 32-byte alignment."""
    import gguf

    total = 0
    for _, rows, cols, dtype in tensors(shape):
        block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[dtype]]
        nbytes = max(rows, 1) * cols // block * size
        total += (nbytes + 31) // 32 * 32
    return total


def write_model(path: str | Path, shape: Shape | str, seed: int = 0) -> Path:
    """Write `shape` (or the name of one in SHAPES) as a GGUF at `path`; returns the path."""
    import gguf

    shape = SHAPES[shape] if isinstance(shape, str) else shape
    path = Path(path)
    rng = np.random.default_rng(seed)
    block = (rng.standard_normal(1 << 16) * 0.02).astype(np.float32)
    file_type = {"F32": gguf.LlamaFileType.ALL_F32, "F16": gguf.LlamaFileType.MOSTLY_F16,
                 "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0, "Q4_0": gguf.LlamaFileType.MOSTLY_Q4_0}[shape.dtype]

    writer = gguf.GGUFWriter(str(path), arch=shape.arch)
    writer.add_name(f"board-{shape.name}")
    writer.add_context_length(shape.context_length)
    writer.add_embedding_length(shape.n_embd)
    writer.add_block_count(shape.n_layer)
    writer.add_feed_forward_length(list(shape.n_ff) if isinstance(shape.n_ff, tuple) else shape.n_ff)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(list(shape.n_head_kv) if isinstance(shape.n_head_kv, tuple) else shape.n_head_kv)
    if shape.head_dim:
        writer.add_key_length(shape.head_dim)
        writer.add_value_length(shape.head_dim)
    writer.add_rope_dimension_count(shape.head_size)
    writer.add_layer_norm_rms_eps(1e-5)
    if shape.sliding_window:
        writer.add_sliding_window(shape.sliding_window)
    writer.add_file_type(file_type)

    tokens = vocabulary(shape.n_vocab)
    n_words = len(tokens) - BASE_VOCAB
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * len(CONTROL) + [-1.0] * 256 + [-2.0] + [-3.0 - i for i in range(n_words)])
    writer.add_token_types(
        [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
        + [gguf.TokenType.BYTE] * 256
        + [gguf.TokenType.NORMAL] * (1 + n_words)
    )
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_chat_template(CHATML)

    for name, rows, cols, dtype in tensors(shape):
        data = np.resize(block, (rows, cols)) if rows else np.ones(cols, dtype=np.float32)
        if dtype == "F32":
            writer.add_tensor(name, data)
        elif dtype == "F16":
            writer.add_tensor(name, data.astype(np.float16))
        else:
            qtype = gguf.GGMLQuantizationType[dtype]
            writer.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


if __name__ == "__main__":
    import sys
    import time

    directory = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    for name in sys.argv[2:] or SHAPES:
        start = time.monotonic()
        written = write_model(directory / f"{name}.gguf", name)
        print(f"{written}  {written.stat().st_size / 2**20:8.2f} MiB  {time.monotonic() - start:.2f} s")
