"""The gateway's API keys, as pure rules: how a key is made, hashed and shown, and the classes' order.

A key is printed once, when it is made; the database keeps only its SHA-256 (a key is 32 random bytes, so a
fast hash is enough: there is nothing to guess) and a short fingerprint for people to tell keys apart.
"""

from __future__ import annotations

import hashlib
import secrets

from app.config import CLASSES

PREFIX = "bk-"  # a board key, recognisable in a leaked log or a client's config
MAX_MODELS = 64


def new_key() -> str:
    return PREFIX + secrets.token_urlsafe(32)


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()


def fingerprint(hashed: str) -> str:
    """What lists show: the hash's first 8 hex digits, which say nothing of the key."""
    return hashed[:8]


def class_rank(klass: str | None) -> int:
    """Admission order when a model's slots are full: online first, then batch, then the rest (CLASSES' order)."""
    return CLASSES.index(klass) if klass in CLASSES else len(CLASSES)


def parse_models(text: str | None) -> list[str] | None:
    """`a,b` as a list of aliases; None (every model) for None or an empty text. ValueError for a bad one."""
    if text is None or not text.strip():
        return None
    models = [m.strip() for m in text.split(",") if m.strip()]
    if len(models) > MAX_MODELS:
        raise ValueError(f"at most {MAX_MODELS} models per key")
    for model in models:
        if len(model) > 200 or not model.isprintable():
            raise ValueError(f"{model[:40]!r} is not a model alias")
    return models
