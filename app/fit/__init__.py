"""Memory accounting: what llama-server will hold on each card for a model, context and concurrency.

gguf_model reads the shape of a model from its GGUF header and tensor index; estimate applies
llama.cpp's own rules for weights, KV cache and overhead per card; graph models the compute buffers
that llama.cpp's scheduler reserves; report lays out the options for 1, 2, 4 and 8 cards.
"""
