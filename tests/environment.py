"""What a test run needs before Holdfast starts: a secret key and its var directory.

Settings only read them (``make setup`` makes them for ``make run``), so a test run
from a fresh clone, or with a fresh ``HOLDFAST_VAR_DIR``, makes its own. Loaded with
``-p tests.environment`` (pyproject.toml): pytest-django reads the settings before any
conftest is imported, so a conftest would be too late to give them a key.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests() -> None:
    # One key for the whole run, inherited by every process a test starts (the
    # sandbox, a live server's workers): django-q2 signs its task packages with it.
    os.environ.setdefault("DJANGO_SECRET_KEY", f"tests-{secrets.token_urlsafe(32)}")
    # Tests talk plain HTTP to their live servers; with DEBUG off (pytest-django's
    # default too) every request would be redirected to HTTPS.
    os.environ.setdefault("HOLDFAST_SSL_REDIRECT", "false")
    # `make test` runs the suite in several processes (pytest-xdist): each gets a var
    # directory of its own under the run's, so their SQLite test databases, blobs,
    # secrets and metrics files never meet.
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        var_dir = Path(os.environ.get("HOLDFAST_VAR_DIR") or Path(__file__).parents[1] / "var")
        os.environ["HOLDFAST_VAR_DIR"] = str(var_dir / f"xdist-{worker}")


def pytest_sessionstart() -> None:
    from django.conf import settings

    # The test databases are SQLite files in VAR_DIR; WhiteNoise warns when
    # STATIC_ROOT is missing.
    for directory in (settings.VAR_DIR, settings.STATIC_ROOT):
        directory.mkdir(parents=True, exist_ok=True)
    # A fast hasher for every login the tests make: the real one takes half a second a
    # password by design, and the suite creates and checks hundreds. Set before any
    # password is hashed, so the hashers' cache never holds the slow one.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
