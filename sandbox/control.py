"""Who may use the sandbox's control routes (``/_sandbox/...``): whoever holds its token.

The control routes arm faults, wipe the records and list customers' email addresses,
and the sandbox listens on the developer's own machine, where any web page they open
can send it requests. So every control route, GET included, asks for

- ``Authorization: Bearer <control token>`` (else 401), and
- for POST and DELETE, ``Content-Type: application/json`` (else 415).

Another site's page cannot send either header without a CORS preflight, and the
sandbox approves none (OPTIONS is a 405 without any ``Access-Control-*`` header). The
token also has to be secret: a page that rebinds its own host name to 127.0.0.1
becomes same-origin and may send any header, but it cannot know the token.

The token is ``SANDBOX_CONTROL_TOKEN`` when that is set (a script that starts the
sandbox can choose it); otherwise ``runsandbox`` makes one and writes it to
``<VAR_DIR>/sandbox-token``, readable by its owner only, and keeps it across restarts.
Every local client finds it through ``control_token()``.
"""

from __future__ import annotations

import hmac
import os
import secrets
from collections.abc import Mapping
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from sandbox.responses import ApiError

TOKEN_FILE_NAME = "sandbox-token"  # noqa: S105 (a file name, not a secret)
# A chosen token shorter than this is a typo or a placeholder, not a secret.
MIN_TOKEN_LENGTH = 16
# The methods that change something: the ones that must also say they send JSON.
WRITE_METHODS = ("POST", "DELETE")


class ControlTokenMissing(Exception):
    """Neither SANDBOX_CONTROL_TOKEN nor a token file: the sandbox has not run here yet."""


def token_path(var_dir: Path | str | None = None) -> Path:
    """Where ``runsandbox`` keeps the token it made: ``<VAR_DIR>/sandbox-token``."""
    return Path(var_dir if var_dir is not None else settings.VAR_DIR) / TOKEN_FILE_NAME


def control_token() -> str:
    """The token a local client sends to ``/_sandbox/``: ``SANDBOX_CONTROL_TOKEN``, else
    the one in ``<VAR_DIR>/sandbox-token``. Raises ``ControlTokenMissing`` without either."""
    return _configured_token() or read_token(token_path())


def read_token(path: Path) -> str:
    """The token in a token file; ``ControlTokenMissing`` when it is absent or empty."""
    try:
        token = path.read_text().strip()
    except FileNotFoundError:
        token = ""
    if not token:
        raise ControlTokenMissing(
            f"No sandbox control token: set SANDBOX_CONTROL_TOKEN, or start the sandbox "
            f"(manage.py runsandbox), which writes one to {path}."
        )
    return token


def ensure_control_token() -> tuple[str, Path | None]:
    """For ``runsandbox``: the token to require, and the file it is in (None when it
    comes from ``SANDBOX_CONTROL_TOKEN``). Writes a new token file if there is none."""
    configured = _configured_token()
    if configured:
        return configured, None
    path = token_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        token = read_token(path)
    except ControlTokenMissing:
        _publish(path, "sbx_" + secrets.token_urlsafe(32))
        # Whoever published first wins: the token is the one in the file.
        token = read_token(path)
    # A file made or copied by hand may be readable by others: it is a secret.
    path.chmod(0o600)
    return token, path


def _publish(path: Path, token: str) -> None:
    """Write the token to a private temporary file, then link it into place.

    Linking fails if the file exists, so two sandboxes starting on one var directory
    agree on one token, and a client never reads a half-written file.
    """
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(descriptor, "w") as handle:
            handle.write(token + "\n")
        try:
            os.link(temporary, path)
        except FileExistsError:
            if not path.read_text().strip():
                # An empty file holds no token anyone could be using: replace it.
                os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def _configured_token() -> str:
    token = getattr(settings, "SANDBOX_CONTROL_TOKEN", "").strip()
    if token and len(token) < MIN_TOKEN_LENGTH:
        raise ImproperlyConfigured(
            f"SANDBOX_CONTROL_TOKEN must be at least {MIN_TOKEN_LENGTH} characters "
            "(e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))')."
        )
    return token


def authorize(*, method: str, headers: Mapping[str, str], token: str) -> None:
    """Raise the answer a control request gets without the token (401) or, for a POST
    or DELETE, without a JSON content type (415); return when it may go on."""
    scheme, _, presented = headers.get("Authorization", "").partition(" ")
    valid = scheme.lower() == "bearer" and hmac.compare_digest(
        presented.strip().encode(), token.encode()
    )
    if not valid:
        raise ApiError(
            401,
            "The sandbox's control routes need its control token: 'Authorization: Bearer "
            "<token>', the token being SANDBOX_CONTROL_TOKEN or the contents of "
            f"{TOKEN_FILE_NAME} in the var directory.",
            type="authentication_error",
            headers={"WWW-Authenticate": 'Bearer realm="sandbox"'},
        )
    if method in WRITE_METHODS:
        media_type = headers.get("Content-Type", "").partition(";")[0].strip().lower()
        if media_type != "application/json":
            raise ApiError(
                415,
                f"{method} to the sandbox's control routes needs 'Content-Type: application/json'.",
            )
