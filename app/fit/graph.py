"""The compute buffers llama.cpp reserves: a replay of its graph allocator over the worst-case graph.

How this was derived (llama.cpp as built by `make llama-server`):
- llama_context::sched_reserve builds the prompt-processing graph for n_tokens = min(n_ctx, n_ubatch)
  tokens over n_seq_max sequences with n_outputs = min(n_tokens, n_outputs_max); llama-server sets
  n_outputs_max to its slot count (server_output_limits). That graph is the largest, so it sizes the buffers.
- ggml-alloc.c (ggml_gallocr_alloc_graph_impl) walks the nodes in order. Graph inputs are allocated first;
  each node gets a best-fit block (ggml_dyn_tallocr_alloc, blocks padded to the buffer's alignment) unless
  its op may work in place (ggml_op_can_inplace) on a parent nobody else still reads; a tensor is freed
  once its last reader has run. The buffer's size is the high-water mark. `Allocator` replays exactly that.
- The node list follows llm_graph_context (src/llama-graph.cpp) for the llama-style transformer block:
  RMS norm, Q/K/V projections, RoPE, the Hadamard rotation of a quantised cache, writing K and V into the
  cache (views of the KV buffer, nothing allocated), attention (flash, or KQ then softmax then KQV then a
  contiguous copy), the output projection, the residual, the FFN (SwiGLU, or the MoE experts), and at the
  end the output norm and the logits. The last layer keeps only the output rows (inp_out_ids).
- With several cards the scheduler gives each card the layers whose weights it holds, and copies what a
  card needs from elsewhere (the positions, masks, cache indices and the residual stream) into its own
  buffer: GGML_SCHED_MAX_COPIES (4) times when pipeline parallelism is on (more than one GPU).
Views, reshapes and permutes allocate nothing; the KV cache and the weights live in their own buffers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

F32, F16, I32, I64 = 4, 2, 4, 8
CPU_ALIGNMENT = 32  # ggml-cpu TENSOR_ALIGNMENT
CUDA_ALIGNMENT = 128  # ggml-cuda buffer alignment
PIPELINE_COPIES = 4  # GGML_SCHED_MAX_COPIES


@dataclass
class Tensor:
    name: str
    size: int
    srcs: tuple[str, ...] = ()
    inplace: bool = False  # the op is one ggml_op_can_inplace allows
    input: bool = False
    output: bool = False


@dataclass
class Graph:
    """Nodes in execution order; a source that is not a node here lives in another buffer (weights, cache)."""
    nodes: list[Tensor] = field(default_factory=list)

    def add(self, name: str, size: int, *srcs: str, inplace: bool = False, output: bool = False) -> str:
        self.nodes.append(Tensor(name, int(size), tuple(srcs), inplace=inplace, output=output))
        return name

    def input(self, name: str, size: int) -> str:
        self.nodes.append(Tensor(name, int(size), input=True))
        return name


class Allocator:
    """ggml_dyn_tallocr for one chunk: free blocks sorted by offset, best fit among all but the last block,
    then the last (growing) block; freed blocks merge with their neighbours."""

    def __init__(self, alignment: int):
        self.alignment = alignment
        self.free: list[list[int]] = [[0, 1 << 62]]  # [offset, size]
        self.high = 0

    def _pad(self, size: int) -> int:
        return -(-size // self.alignment) * self.alignment

    def alloc(self, size: int) -> int:
        size = self._pad(size)
        best = None
        for i, (_, block) in enumerate(self.free[:-1]):
            if block >= size and (best is None or block <= self.free[best][1]):
                best = i
        if best is None:
            best = len(self.free) - 1
        offset = self.free[best][0]
        self.free[best][0] += size
        self.free[best][1] -= size
        if self.free[best][1] == 0:
            del self.free[best]
        self.high = max(self.high, offset + size)
        return offset

    def release(self, offset: int, size: int) -> None:
        size = self._pad(size)
        for i, block in enumerate(self.free):
            if block[0] + block[1] == offset:
                block[1] += size
                if i + 1 < len(self.free) and block[0] + block[1] == self.free[i + 1][0]:
                    block[1] += self.free.pop(i + 1)[1]
                return
            if offset + size == block[0]:
                block[0] = offset
                block[1] += size
                if i > 0 and self.free[i - 1][0] + self.free[i - 1][1] == block[0]:
                    self.free[i - 1][1] += self.free.pop(i)[1]
                return
        position = next((i for i, block in enumerate(self.free) if block[0] > offset), len(self.free))
        self.free.insert(position, [offset, size])


def reserve(graph: Graph, alignment: int) -> int:
    """The buffer size ggml_gallocr reserves for `graph`."""
    nodes = {t.name: t for t in graph.nodes}
    readers: dict[str, int] = {}
    for t in graph.nodes:
        for src in t.srcs:
            readers[src] = readers.get(src, 0) + 1
    allocator = Allocator(alignment)
    where: dict[str, int] = {}
    for t in graph.nodes:
        if t.input:
            where[t.name] = allocator.alloc(t.size)
    for t in graph.nodes:
        if t.input:
            continue
        reused = None
        if t.inplace:
            reused = next((s for s in t.srcs if s in where and readers[s] == 1 and not nodes[s].output
                           and nodes[s].size == t.size), None)
        if reused is not None:
            where[t.name] = where.pop(reused)
            readers[reused] = -1  # handed over: never freed under its old name
        else:
            where[t.name] = allocator.alloc(t.size)
        for src in dict.fromkeys(t.srcs):
            if src not in where:
                continue
            readers[src] -= t.srcs.count(src)
            if readers[src] == 0 and not nodes[src].output:
                allocator.release(where.pop(src), nodes[src].size)
    return allocator.high


@dataclass(frozen=True)
class Shape:
    """What the graph's tensor sizes depend on: the model's hyperparameters and the context settings."""
    n_embd: int
    n_vocab: int
    n_head: Sequence[int]
    n_head_kv: Sequence[int]
    n_ff: Sequence[int]
    head_k: int
    head_v: int
    swa: Sequence[bool]
    n_expert: int
    n_expert_used: int
    n_tokens: int  # min(n_ctx, n_ubatch)
    n_outputs: int
    n_kv: int  # cells per stream that one layer attends over
    n_kv_swa: int
    n_stream: int
    flash_attn: bool
    rot_k: int  # the Hadamard block for a quantised K cache, 0 for none
    rot_v: int


def _inputs(g: Graph, s: Shape, layers: Sequence[int], copies: int, prefix: str) -> dict[str, list[str]]:
    """The graph inputs `layers` read, `copies` times over (the scheduler's copies of a split's inputs)."""
    T = s.n_tokens
    mask_type = F16 if s.flash_attn else F32
    v_gqa = max(s.head_v * h for h in s.n_head_kv)
    sizes = {
        "pos": T * I32,
        "k_idxs": T * I64,
        "v_idxs": T * I64 * (1 if s.flash_attn else v_gqa),  # a transposed V cache scatters every element
        "mask": s.n_kv * (T // s.n_stream) * s.n_stream * mask_type,
    }
    if any(s.swa[il] for il in layers):
        sizes |= {"mask_swa": s.n_kv_swa * (T // s.n_stream) * s.n_stream * mask_type,
                  "k_idxs_swa": sizes["k_idxs"], "v_idxs_swa": sizes["v_idxs"]}
    if s.rot_k:
        sizes["k_rot"] = s.rot_k * s.rot_k * F32
    if s.rot_v:
        sizes["v_rot"] = s.rot_v * s.rot_v * F32
    return {name: [g.input(f"{prefix}{name}#{c}", size) for c in range(copies)] for name, size in sizes.items()}


def _layer(g: Graph, s: Shape, il: int, x: str, inputs: dict[str, list[str]], last: bool) -> str:
    """One transformer block reading the residual stream `x`; returns the new residual stream."""
    T, E = s.n_tokens, s.n_embd
    H, Hkv = s.n_head[il], s.n_head_kv[il]
    swa = s.swa[il]
    n_kv = s.n_kv_swa if swa else s.n_kv
    inp = {name: copies[0] for name, copies in inputs.items()}  # the other copies stay allocated, unread
    p = f"l{il}."

    cur = g.add(p + "norm", E * T * F32, x, inplace=True)
    cur = g.add(p + "attn_norm", E * T * F32, cur, inplace=True)
    # the order build_attn expands them in: Q (and its rotation), V, then K, each straight after its inputs
    q = g.add(p + "q", s.head_k * H * T * F32, cur)
    # Q's RoPE gets a tensor of its own, unlike K's: measured against the CPU server, with Q roped in place
    # every run without flash attention came out exactly one Q-sized tensor short (one over with a rotated
    # K cache), across 9 shapes and 4 settings (scripts/fit_accuracy.py); roped apart, all match to 0.01 MiB.
    q = g.add(p + "q_rope", s.head_k * H * T * F32, q, inp["pos"])
    if s.rot_k:
        q = g.add(p + "q_rot", s.head_k * H * T * F32, q, inp["k_rot"])
    v = g.add(p + "v", s.head_v * Hkv * T * F32, cur)
    if s.rot_v:
        v = g.add(p + "v_rot", s.head_v * Hkv * T * F32, v, inp["v_rot"])
    k = g.add(p + "k", s.head_k * Hkv * T * F32, cur)
    k = g.add(p + "k_rope", s.head_k * Hkv * T * F32, k, inp["pos"], inplace=True)
    if s.rot_k:
        k = g.add(p + "k_rot", s.head_k * Hkv * T * F32, k, inp["k_rot"])
    suffix = "_swa" if swa else ""
    g.add(p + "k_store", 0, k, inp["k_idxs" + suffix])  # set_rows into the cache: a view, nothing allocated
    g.add(p + "v_store", 0, v, inp["v_idxs" + suffix])
    mask = inp["mask" + suffix]
    if s.flash_attn:
        out = g.add(p + "fattn", s.head_v * H * T * F32, q, mask)
    else:
        rows = (T // s.n_stream) * s.n_stream
        kq = g.add(p + "kq", n_kv * rows * H * F32, q)
        kq = g.add(p + "kq_soft_max", n_kv * rows * H * F32, kq, mask, inplace=True)
        kqv = g.add(p + "kqv", s.head_v * H * rows * F32, kq)
        out = g.add(p + "kqv_cont", s.head_v * H * T * F32, kqv)
    if s.rot_v:
        out = g.add(p + "out_rot", s.head_v * H * T * F32, out, inp["v_rot"])
    cur = g.add(p + "wo", E * T * F32, out)
    n = T
    if last:
        n = s.n_outputs
        cur = g.add(p + "out_rows", E * n * F32, cur, inp["out_ids"])
        x = g.add(p + "inp_rows", E * n * F32, x, inp["out_ids"])
    ffn_inp = g.add(p + "ffn_inp", E * n * F32, cur, x, inplace=True)
    cur = g.add(p + "ffn_norm", E * n * F32, ffn_inp, inplace=True)
    cur = g.add(p + "ffn_norm_w", E * n * F32, cur, inplace=True)
    F = s.n_ff[il]
    if s.n_expert:
        k_used = s.n_expert_used
        logits = g.add(p + "moe_logits", s.n_expert * n * F32, cur)
        probs = g.add(p + "moe_probs", s.n_expert * n * F32, logits, inplace=True)
        chosen = g.add(p + "moe_topk", k_used * n * I32, probs)
        weights = g.add(p + "moe_weights", k_used * n * F32, probs, chosen)
        up = g.add(p + "moe_up", F * k_used * n * F32, cur, chosen)
        gate = g.add(p + "moe_gate", F * k_used * n * F32, cur, chosen)
        act = g.add(p + "moe_act", F * k_used * n * F32, gate, up)
        down = g.add(p + "moe_down", E * k_used * n * F32, act, chosen)
        down = g.add(p + "moe_weighted", E * k_used * n * F32, down, weights, inplace=True)
        cur = g.add(p + "moe_out", E * n * F32, down)
    else:
        gate = g.add(p + "ffn_gate", F * n * F32, cur)
        up = g.add(p + "ffn_up", F * n * F32, cur)
        act = g.add(p + "ffn_swiglu", F * n * F32, gate, up)
        cur = g.add(p + "ffn_down", E * n * F32, act)
    return g.add(p + "l_out", E * n * F32, cur, ffn_inp, inplace=True)


def compute_bytes(s: Shape, devices: Sequence[Sequence[int]], output_device: int, *, gpu: bool) -> tuple[list[int], int]:
    """Bytes of compute buffer per device (each device holding `devices[d]`, its layers) and on the host.

    On GPUs the host keeps the inputs and the token embedding lookup; each card gets copies of what its
    layers read. With one CPU "device" (the test build) the whole graph is one buffer."""
    T, E = s.n_tokens, s.n_embd
    copies = PIPELINE_COPIES if gpu and len(devices) > 1 else 1
    alignment = CUDA_ALIGNMENT if gpu else CPU_ALIGNMENT
    per_device = []
    for d, layers in enumerate(devices):
        g = Graph()
        prefix = f"d{d}."
        # inputs are allocated in the order the graph first reaches them: the residual stream, then the rest
        if not gpu and d == 0:
            x = _embeddings(g, s)
        else:
            x = [g.input(f"{prefix}x#{c}", E * T * F32) for c in range(copies)][0]
        inputs = _inputs(g, s, layers, copies, prefix) if layers or d == output_device else {}
        if d == output_device or len(s.n_head) - 1 in layers:
            inputs["out_ids"] = [g.input(f"{prefix}out_ids#{c}", s.n_outputs * I32) for c in range(copies)]
        for il in layers:
            x = _layer(g, s, il, x, inputs, last=il == len(s.n_head) - 1)
        if d == output_device:
            # the output rows only (the last layer kept no others), also on a card that holds no layer
            cur = g.add("out_norm", E * s.n_outputs * F32, x, inplace=True)
            cur = g.add("out_norm_w", E * s.n_outputs * F32, cur, inplace=True)
            g.add("logits", s.n_vocab * s.n_outputs * F32, cur, output=True)
        per_device.append(reserve(g, alignment) if g.nodes else 0)
    host = 0
    if gpu:
        g = Graph()
        _embeddings(g, s)
        g.nodes[-1].output = True  # read by the first card's copy
        host = reserve(g, CPU_ALIGNMENT)
    return per_device, host


def _embeddings(g: Graph, s: Shape) -> str:
    """The input layer (build_inp_embd) selects one of three branches at run time, but all are allocated:
    the token lookup; an embeddings input, which nothing reads, so it is never freed; and the mixed batch
    (a lookup scattered into a copy of another embeddings input): the copy is never freed either, since
    the scatter's result is a view of it that nothing reads."""
    T, E = s.n_tokens, s.n_embd
    tokens = g.input("tokens", T * I32)
    g.input("embd_input", E * T * F32)
    # in the order the graph first reaches them: ggml_set_rows's sources are (rows, indices, destination)
    mixed_tokens = g.input("mixed_tokens", T * I32)
    mixed_slots = g.input("mixed_slots", T * I64)
    mixed_embd = g.input("mixed_embd", E * T * F32)
    embd = g.add("embd", E * T * F32, tokens)
    rows = g.add("mixed_rows", E * T * F32, mixed_tokens)
    g.add("mixed_copy", E * T * F32, mixed_embd, output=True)
    g.add("mixed_set", 0, rows, mixed_slots)
    return embd
