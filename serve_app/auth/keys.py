"""API key generation and hashing: the only place that touches key material.

Keys are ``sk-sa-`` followed by 43 URL-safe characters from ``secrets`` (256 bits). The
store keeps only ``sha256(key)``:

- a slow password hash (bcrypt, argon2) exists to make guessing *low-entropy* secrets
  expensive; guessing a 256-bit random key is hopeless at any hash speed, so a fast hash
  loses nothing and keeps lookups at one indexed query per request;
- looking a key up *by its hash* means the database never compares secret bytes, so the
  timing of that comparison leaks at most a prefix of a hash, which reveals nothing usable;
- a leaked database yields no usable keys.

Operator-chosen keys (``SERVE_APP_API_KEY``) may be short; they are for local use and
documented as such.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

KEY_PREFIX = "sk-sa-"
KEY_RANDOM_BYTES = 32
HINT_MIN_SECRET = 16  # show a key's last 4 characters only when it has at least this many
MAX_KEY_LENGTH = 512  # a longer "key" is garbage: reject it before hashing


def generate_key() -> str:
    """A new random API key with the recognisable prefix (so leaks can be grepped for)."""
    return KEY_PREFIX + secrets.token_urlsafe(KEY_RANDOM_BYTES)


def hash_key(key: str) -> str:
    """The stored form of a key: hex sha256 of its UTF-8 bytes."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def key_hint(key: str) -> str:
    """What ``list`` and logs may show: the known prefix (if any) and the last 4 characters.

    A short operator-chosen key shows no characters at all: 4 of them would be most of it.
    """
    prefix = KEY_PREFIX if key.startswith(KEY_PREFIX) else ""
    tail = key[-4:] if len(key) - len(prefix) >= HINT_MIN_SECRET else ""
    return f"{prefix}...{tail}"


def hashes_match(a: str, b: str) -> bool:
    """Constant-time equality, for every place that compares key hashes in Python."""
    return hmac.compare_digest(a.encode("ascii"), b.encode("ascii"))


def is_plausible_key(key: str | None) -> bool:
    """Cheap sanity check before hashing: non-empty, bounded, printable, no whitespace."""
    return bool(key) and len(key) <= MAX_KEY_LENGTH and key.isprintable() and " " not in key
