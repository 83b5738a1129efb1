"""How an evidence bundle is signed, and how a copy of one is checked.

Both signatures are over the same bytes: the bundle's canonical JSON (sorted keys, no
insignificant whitespace, UTF-8 with no \\u escapes for non-ASCII text), the engine's
``canonical_json``.

- ``sha256``: its SHA-256. Anyone can recompute it (``verify_command``), with nothing
  but Python. It names the facts: the audit log keeps the hash of every bundle handed
  out, so a copy shown later can be matched against what was exported, when and by whom.
- ``hmac_sha256``: HMAC-SHA256 under a key derived from this deployment's SECRET_KEY.
  Anyone who edits a bundle can recompute its SHA-256; only this deployment can make
  the HMAC, and only it can check it (``manage.py verifyevidence``), since the key is
  never given out. Keys in SECRET_KEY_FALLBACKS still verify after a rotation.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any, NamedTuple

from django.conf import settings
from django.utils.crypto import salted_hmac

from agentruns.runtime import canonical_json

# Keeps this HMAC apart from every other use Django makes of the secret key.
HMAC_SALT = "holdfast.evidence.bundle"

# Recomputes the SHA-256 of the bundle in a downloaded file: ``verify_command(name)``.
# Shown in the file and on the printable page; tests/evidence/test_signing.py runs it.
_VERIFY = (
    "python3 -c 'import hashlib,json,sys; "
    'b=json.load(open(sys.argv[1],encoding="utf-8"))["bundle"]; '
    'print(hashlib.sha256(json.dumps(b,sort_keys=True,separators=(",",":"),'
    "ensure_ascii=False).encode()).hexdigest())'"
)


def verify_command(filename: str) -> str:
    """The shell command that prints the SHA-256 of the bundle in ``filename``."""
    return f"{_VERIFY} {filename}"


class Signature(NamedTuple):
    sha256: str
    hmac_sha256: str


def canonical_bytes(bundle: Any) -> bytes:
    return canonical_json(bundle).encode("utf-8")


def _hmac(data: bytes, secret: str) -> str:
    return salted_hmac(HMAC_SALT, data, secret=secret, algorithm="sha256").hexdigest()


def sign(bundle: Any) -> Signature:
    data = canonical_bytes(bundle)
    return Signature(hashlib.sha256(data).hexdigest(), _hmac(data, settings.SECRET_KEY))


class Verdict(NamedTuple):
    """What a copy of a bundle shows: its SHA-256 as recomputed, whether that is the
    one it states, and whether this deployment's key (or a fallback) made its HMAC."""

    sha256: str
    sha256_matches: bool
    hmac_matches: bool


def verify(document: dict[str, Any]) -> Verdict:
    """Check a document as exported: ``{"bundle": {...}, "sha256": …, "hmac_sha256": …}``."""
    data = canonical_bytes(document.get("bundle"))
    digest = hashlib.sha256(data).hexdigest()
    stated_hmac = str(document.get("hmac_sha256") or "")
    keys = [settings.SECRET_KEY, *getattr(settings, "SECRET_KEY_FALLBACKS", [])]
    return Verdict(
        digest,
        hmac.compare_digest(digest, str(document.get("sha256") or "")),
        any(hmac.compare_digest(_hmac(data, key), stated_hmac) for key in keys),
    )
