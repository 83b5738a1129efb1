"""Request bodies: JSON, within the size the deployment allows, nested no deeper than
``MAX_NESTING``; anything else is refused in the API's error shape before it is walked."""

from __future__ import annotations

import json
from typing import Any

from ninja.parser import Parser

from api.errors import ApiError

# Deeper than any run input or decision needs; a deeper body is refused before it is parsed.
MAX_NESTING = 32


def nesting(raw: bytes) -> int:
    """How deep brackets nest in a JSON text, outside strings (no parse, no recursion)."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in raw:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return deepest


class JsonBodyParser(Parser):
    """ninja's parser with the API's limits. (Reading ``request.body`` past
    ``DATA_UPLOAD_MAX_MEMORY_SIZE`` raises ``RequestDataTooBig``, which
    ``api.errors`` answers with 413.)"""

    def parse_body(self, request) -> Any:
        raw = request.body
        if nesting(raw) > MAX_NESTING:
            raise ApiError(
                400,
                f"the body is nested deeper than {MAX_NESTING} levels",
                errors={"body": ["nested too deeply"]},
            )
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
            raise ApiError(
                400, "the body is not valid JSON", errors={"body": [str(exc)[:200]]}
            ) from exc
