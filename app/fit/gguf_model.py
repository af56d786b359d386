"""A model's shape from its GGUF header and tensor index (never the tensor data; see gguf_header).

Tensors are grouped as llama.cpp places them (src/llama-model.cpp, load_tensors): the input layer
(token_embd and friends) stays on the host, `blk.N.*` is repeating layer N, and the output layer
(output, output_norm, cls) counts as layer n_layer. A model without `output.weight` reuses the token
embedding as its output: llama.cpp then loads a second copy of it with the output layer.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from app.errors import BadInput
from app.fit.gguf_header import Counted, read_header

# Architectures whose attention keeps a plain K and V row per token per layer: the KV rule below holds.
# MLA (deepseek2), recurrent and hybrid models (mamba, rwkv, qwen3next) size their memory otherwise.
# Values: (default sliding-window pattern, default window); None when the arch has none.
KNOWN_ARCHITECTURES: dict[str, tuple[int, int] | None] = {
    "llama": None, "mistral3": None, "qwen2": None, "qwen2moe": None, "qwen3": None, "qwen3moe": None,
    "phi3": None, "internlm2": None, "gemma": None, "starcoder2": None, "command-r": None, "olmo2": None,
    "granite": None, "granitemoe": None, "deci": None,
    "gemma2": (2, 4096), "gemma3": (6, 0), "cohere2": (4, 0), "gpt-oss": (2, 0),
}

_SPLIT = re.compile(r"^(?P<stem>.*)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$")
_BLOCK = re.compile(r"^blk\.(\d+)\.")
_INPUT = ("token_embd.", "position_embd.", "token_types.")
MAX_LAYERS = 512  # llama.cpp's LLAMA_MAX_LAYERS: its per-layer arrays hold no more


class UnknownArchitecture(BadInput):
    """A model whose memory board cannot size: the check that needs the estimate steps aside."""


@dataclass(frozen=True)
class Model:
    path: str
    name: str
    arch: str
    file_bytes: int
    n_layer: int
    n_embd: int
    n_vocab: int
    n_ctx_train: int
    n_head: tuple[int, ...]  # per layer
    n_head_kv: tuple[int, ...]  # per layer; 0 for a layer without attention
    n_ff: tuple[int, ...]  # per layer (per expert for MoE)
    head_k: int
    head_v: int
    swa: tuple[bool, ...]  # per layer: a sliding-window layer
    n_swa: int
    n_expert: int
    n_expert_used: int
    layer_bytes: tuple[int, ...]  # the weights of each repeating layer
    output_bytes: int  # the output layer, including the second copy of a tied embedding
    input_bytes: int  # the input layer: stays on the host
    tied_output: bool
    tensor_bytes: int  # every tensor in the files once: what a CPU llama-server maps
    weight_type: str  # the most common type among the large tensors, e.g. "Q4_K"

    @property
    def weights_bytes(self) -> int:
        return self.input_bytes + sum(self.layer_bytes) + self.output_bytes

    def n_embd_k_gqa(self, layer: int) -> int:
        return self.head_k * self.n_head_kv[layer]

    def n_embd_v_gqa(self, layer: int) -> int:
        return self.head_v * self.n_head_kv[layer]


def split_paths(path: Path) -> list[Path]:
    """All files of a split model (`-00001-of-00003.gguf`), or just the one file."""
    match = _SPLIT.match(path.name)
    if not match:
        return [path]
    count = int(match["count"])
    return [path.with_name(f"{match['stem']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]


def read_model(path: str | os.PathLike) -> Model:
    """The model's shape; BadInput with a one-line reason for a file that is missing, not GGUF, or of an
    architecture whose memory board cannot model."""
    first = Path(path).expanduser()
    files = split_paths(first)
    headers = [_header(f) for f in files]
    fields = headers[0][0]

    def value(key: str, default=None):
        got = fields.get(key, default)
        if isinstance(got, Counted):
            raise BadInput(f"{first}: the GGUF field {key} is an array of {got.length}, too long to be per layer")
        return got

    def count(key: str, default=None, *, layers: bool = False):
        """A number the shape is made of, as llama.cpp reads it: a whole number from 0 (or a list, one a layer)."""
        got = value(key, default)
        items = got if layers and isinstance(got, list) else [got]
        if got is not None and not all(isinstance(x, int) and x >= 0 for x in items):
            raise BadInput(f"{first}: the GGUF field {key} is not a count (a whole number, 0 or more)")
        return got

    arch = fields.get("general.architecture")
    if not isinstance(arch, str):
        raise BadInput(f"{first}: the GGUF header names no architecture (general.architecture)")
    if arch not in KNOWN_ARCHITECTURES:
        raise UnknownArchitecture(f"{first}: board can't size the {arch!r} architecture yet "
                       f"(it knows {', '.join(sorted(KNOWN_ARCHITECTURES))}); give llama-server's own figures a try")

    def need(key: str, layers: bool = False):
        got = count(f"{arch}.{key}", layers=layers)
        if got is None:
            raise BadInput(f"{first}: the GGUF header lacks {arch}.{key}")
        return got

    n_layer = need("block_count")
    if not 1 <= n_layer <= MAX_LAYERS:  # before anything is sized by it
        raise BadInput(f"{first}: {arch}.block_count is {n_layer}; llama.cpp reads 1 to {MAX_LAYERS} layers")
    n_embd = need("embedding_length")
    per_layer = _per_layer(n_layer)
    n_head = per_layer(need("attention.head_count", layers=True))
    if not all(n_head):
        raise BadInput(f"{first}: a layer has no attention heads; board can't size this model")
    n_head_kv = per_layer(count(f"{arch}.attention.head_count_kv", list(n_head), layers=True))
    n_ff = per_layer(count(f"{arch}.feed_forward_length", 0, layers=True))
    n_expert = count(f"{arch}.expert_count", 0)
    if n_expert:
        n_ff = per_layer(count(f"{arch}.expert_feed_forward_length", list(n_ff), layers=True))
    head_k = count(f"{arch}.attention.key_length", n_embd // n_head[0])
    head_v = count(f"{arch}.attention.value_length", n_embd // n_head[0])
    swa, n_swa = _sliding_window(arch, n_layer, count)

    tokens = fields.get("tokenizer.ggml.tokens")
    n_vocab = count(f"{arch}.vocab_size") or (tokens.length if isinstance(tokens, Counted) else 0)

    layer_bytes = [0] * n_layer
    input_bytes = output_bytes = 0
    embedding = 0
    has_output = False
    type_bytes: dict[str, int] = {}
    tensor_bytes = 0
    for _, tensors in headers:
        for tensor in tensors:
            size = tensor.n_bytes
            tensor_bytes += size
            if tensor.name.startswith(_INPUT):
                input_bytes += size
                if tensor.name == "token_embd.weight":
                    embedding = size
            elif (block := _BLOCK.match(tensor.name)) and int(block[1]) < n_layer:
                layer_bytes[int(block[1])] += size
            elif tensor.name == "rope_freqs.weight":  # each layer holds a copy (TENSOR_DUPLICATED)
                layer_bytes = [b + size for b in layer_bytes]
            else:
                output_bytes += size
                has_output = has_output or tensor.name == "output.weight"
            if size >= 1 << 20:
                type_bytes[tensor.type_name] = type_bytes.get(tensor.type_name, 0) + size
    if not has_output:
        output_bytes += embedding

    return Model(
        path=str(first), name=str(value("general.name", first.name)), arch=arch,
        file_bytes=sum(f.stat().st_size for f in files), n_layer=n_layer, n_embd=n_embd, n_vocab=n_vocab,
        n_ctx_train=count(f"{arch}.context_length", 0), n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff,
        head_k=head_k, head_v=head_v, swa=swa, n_swa=n_swa, n_expert=n_expert,
        n_expert_used=count(f"{arch}.expert_used_count", 0), layer_bytes=tuple(layer_bytes),
        output_bytes=output_bytes, input_bytes=input_bytes, tied_output=not has_output, tensor_bytes=tensor_bytes,
        weight_type=max(type_bytes, key=type_bytes.__getitem__) if type_bytes else "F32",
    )


def _header(path: Path):
    try:
        return read_header(path)
    except FileNotFoundError:
        raise BadInput(f"no model file {path}") from None
    except IsADirectoryError:
        raise BadInput(f"{path} is a directory; give a .gguf file") from None
    except OSError as error:
        raise BadInput(f"can't read {path}: {error.strerror}") from None
    except ValueError as error:
        if str(error) == "not a GGUF file":
            raise BadInput(f"{path} is not a GGUF file") from None
        raise BadInput(f"{path}: the GGUF header is damaged ({str(error)[:80]})") from None


def _per_layer(n_layer: int):
    def expand(raw) -> tuple[int, ...]:
        if isinstance(raw, list):
            if len(raw) != n_layer:
                raise BadInput(f"a per-layer GGUF array has {len(raw)} entries for {n_layer} layers")
            return tuple(int(x) for x in raw)
        return (int(raw),) * n_layer
    return expand


def _sliding_window(arch: str, n_layer: int, count) -> tuple[tuple[bool, ...], int]:
    """Which layers attend to a sliding window, as llama.cpp's load_swa_pattern decides."""
    rule = KNOWN_ARCHITECTURES[arch]
    if rule is None or (n_swa := count(f"{arch}.attention.sliding_window", rule[1])) == 0:
        return (False,) * n_layer, 0
    pattern = count(f"{arch}.attention.sliding_window_pattern", rule[0], layers=True)
    if isinstance(pattern, list):
        return tuple(bool(x) for x in _per_layer(n_layer)(pattern)), n_swa
    # Every n-th layer attends in full (llama.cpp's dense_first variant belongs to no architecture here).
    return tuple(pattern == 0 or il % pattern < pattern - 1 for il in range(n_layer)), n_swa
