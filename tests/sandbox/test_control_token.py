"""Where the control token comes from: SANDBOX_CONTROL_TOKEN, or the private file
runsandbox writes to the var directory, which every local client reads."""

from __future__ import annotations

import os
import stat

import pytest
from django.core.exceptions import ImproperlyConfigured

from sandbox.control import (
    ControlTokenMissing,
    control_token,
    ensure_control_token,
    read_token,
    token_path,
)

CHOSEN = "chosen-by-the-benchmark-0123456789"


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def var_dir(settings, tmp_path):
    settings.VAR_DIR = tmp_path / "var"
    settings.SANDBOX_CONTROL_TOKEN = ""
    return settings.VAR_DIR


def test_runsandbox_wrote_its_token_readable_by_its_owner_only(sandbox_process, sandbox_var_dir):
    path = token_path(sandbox_var_dir)

    assert mode(path) == 0o600
    assert read_token(path) == sandbox_process.control_token
    # It says on start where the token is.
    assert str(path) in (sandbox_var_dir / "sandbox.log").read_text()


def test_without_a_configured_token_it_writes_one_for_the_owner_only(var_dir):
    old_umask = os.umask(0)
    try:
        token, path = ensure_control_token()
    finally:
        os.umask(old_umask)

    assert path == var_dir / "sandbox-token"
    assert mode(path) == 0o600
    assert token.startswith("sbx_") and len(token) > 40
    assert control_token() == token
    assert [entry.name for entry in var_dir.iterdir()] == ["sandbox-token"]


def test_a_restarted_sandbox_keeps_its_token(var_dir):
    first, _ = ensure_control_token()
    again, _ = ensure_control_token()
    assert again == first


def test_a_token_file_readable_by_others_is_made_private(var_dir):
    path = token_path()
    var_dir.mkdir()
    path.write_text("sbx_copied-by-hand-0123456789\n")
    path.chmod(0o644)

    token, _ = ensure_control_token()

    assert token == "sbx_copied-by-hand-0123456789"
    assert mode(path) == 0o600


def test_an_empty_token_file_gets_a_token(var_dir):
    var_dir.mkdir()
    token_path().write_text("")

    token, path = ensure_control_token()

    assert token.startswith("sbx_")
    assert read_token(path) == token


def test_a_configured_token_wins_and_no_file_is_written(var_dir, settings):
    settings.SANDBOX_CONTROL_TOKEN = CHOSEN

    assert ensure_control_token() == (CHOSEN, None)
    assert control_token() == CHOSEN
    assert not token_path().exists()


def test_a_configured_token_too_short_to_be_a_secret_is_refused(var_dir, settings):
    settings.SANDBOX_CONTROL_TOKEN = "secret"
    with pytest.raises(ImproperlyConfigured, match="at least 16"):
        ensure_control_token()


def test_a_client_without_any_token_is_told_where_it_would_be(var_dir):
    with pytest.raises(ControlTokenMissing) as missing:
        control_token()
    assert str(token_path()) in str(missing.value)
    assert "SANDBOX_CONTROL_TOKEN" in str(missing.value)
