"""Canonical JSON, hashes and effect keys.

An effect key is computed once, when its step is first recorded, from the run
id, the step id and the canonical arguments; it is stored with the step and
never recomputed, so a later change to this function cannot change the key of
an effect that was already sent.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

EFFECT_KEY_PREFIX = "hf_"


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no insignificant whitespace: equal data, equal text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def content_hash(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()


def make_effect_key(run_id: str, step_id: str, canonical_args: Any) -> str:
    digest = hashlib.sha256(
        "\x1f".join([str(run_id), step_id, canonical_json(canonical_args)]).encode()
    ).hexdigest()
    return f"{EFFECT_KEY_PREFIX}{digest[:48]}"
