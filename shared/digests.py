"""SHA-256 digests of artifacts, as gearbus records them (hex), from bytes or from the
object store's own form ("SHA-256=<base64url>"): a process checks the artifact it downloads
against the digest the master recorded at submission, so a replaced object is never run."""

from __future__ import annotations

import base64
import binascii
import hashlib

_STORE_PREFIX = "SHA-256="


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def from_object_store(digest: str | None) -> str:
    """The hex form of an object-store digest ("" when the store has none)."""
    if not digest or not digest.upper().startswith(_STORE_PREFIX):
        return ""
    encoded = digest[len(_STORE_PREFIX):]
    try:
        return base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).hex()
    except (binascii.Error, ValueError):
        return ""
