"""A tiny llama-architecture GGUF for tests: 64 wide, 2 layers, a byte-level SPM vocabulary, random F32 weights.

About 0.5 MB. It loads and answers in a CPU llama-server in well under a second; the answers are noise.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

WIDTH = 64
LAYERS = 2
HEADS = 4
HEADS_KV = 2
FEED_FORWARD = 128
CONTEXT = 2048

# <unk> <s> </s>, the 256 byte-fallback pieces, and the SPM word marker: 260 tokens.
CONTROL = ["<unk>", "<s>", "</s>"]
TOKENS = CONTROL + [f"<0x{b:02X}>" for b in range(256)] + ["\u2581"]

CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def write_tiny_gguf(path: str | Path, seed: int = 0) -> Path:
    import gguf

    path = Path(path)
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_name("board-tiny")
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(WIDTH)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FEED_FORWARD)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(HEADS_KV)
    writer.add_rope_dimension_count(WIDTH // HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)

    writer.add_tokenizer_model("llama")
    writer.add_token_list(TOKENS)
    writer.add_token_scores([0.0] * 3 + [-1.0] * 256 + [-2.0])
    writer.add_token_types(
        [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
        + [gguf.TokenType.BYTE] * 256
        + [gguf.TokenType.NORMAL]
    )
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_chat_template(CHATML)

    def weights(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    head_dim = WIDTH // HEADS
    vocab = len(TOKENS)
    writer.add_tensor("token_embd.weight", weights(vocab, WIDTH))
    for layer in range(LAYERS):
        block = f"blk.{layer}"
        writer.add_tensor(f"{block}.attn_norm.weight", np.ones(WIDTH, dtype=np.float32))
        writer.add_tensor(f"{block}.attn_q.weight", weights(WIDTH, WIDTH))
        writer.add_tensor(f"{block}.attn_k.weight", weights(HEADS_KV * head_dim, WIDTH))
        writer.add_tensor(f"{block}.attn_v.weight", weights(HEADS_KV * head_dim, WIDTH))
        writer.add_tensor(f"{block}.attn_output.weight", weights(WIDTH, WIDTH))
        writer.add_tensor(f"{block}.ffn_norm.weight", np.ones(WIDTH, dtype=np.float32))
        writer.add_tensor(f"{block}.ffn_gate.weight", weights(FEED_FORWARD, WIDTH))
        writer.add_tensor(f"{block}.ffn_up.weight", weights(FEED_FORWARD, WIDTH))
        writer.add_tensor(f"{block}.ffn_down.weight", weights(WIDTH, FEED_FORWARD))
    writer.add_tensor("output_norm.weight", np.ones(WIDTH, dtype=np.float32))
    writer.add_tensor("output.weight", weights(vocab, WIDTH))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


if __name__ == "__main__":
    import sys

    print(write_tiny_gguf(sys.argv[1] if len(sys.argv) > 1 else "tiny.gguf"))
