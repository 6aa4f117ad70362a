"""Checkpoint documents as an attacker who can write the store makes them: well formed, checksummed (and signed).

The unit tests of the document (tests/state/test_checkpoint.py) and the end-to-end trust tests forge them alike.
"""

from __future__ import annotations


def resealed(body: dict, key: bytes | None = None) -> bytes:
    """``body`` with a valid checksum (and signature): what a forger who can write the store produces."""
    import hashlib
    import hmac

    import orjson

    body = {k: v for k, v in body.items() if k not in ("sha256", "hmac")}
    canonical = orjson.dumps(body, option=orjson.OPT_SORT_KEYS)
    body["sha256"] = hashlib.sha256(canonical).hexdigest()
    if key is not None:
        body["hmac"] = hmac.new(key, canonical, hashlib.sha256).hexdigest()
    return orjson.dumps(body)
