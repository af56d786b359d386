"""The llama-server operations (serve_start, serve_stop, serve_list, serve_logs), registered into OPS."""

from __future__ import annotations
