from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection

from config.env import env_bool, env_float, env_int, env_list, env_str, postgres_from_url


def test_booleans_must_be_true_or_false(monkeypatch):
    monkeypatch.setenv("FLAG", "true")
    assert env_bool("FLAG", False) is True
    monkeypatch.setenv("FLAG", "False")
    assert env_bool("FLAG", True) is False
    monkeypatch.setenv("FLAG", "yes")
    with pytest.raises(ImproperlyConfigured, match="FLAG must be 'true' or 'false'"):
        env_bool("FLAG", False)
    monkeypatch.delenv("FLAG")
    assert env_bool("FLAG", True) is True


def test_numbers_are_parsed_strictly(monkeypatch):
    monkeypatch.setenv("N", "12")
    assert env_int("N", 0) == 12
    monkeypatch.setenv("N", "1.5")
    assert env_float("N", 0) == 1.5
    with pytest.raises(ImproperlyConfigured, match="N must be an integer"):
        env_int("N", 0)


def test_a_secret_can_come_from_a_file(monkeypatch, tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("s3cret\n")
    monkeypatch.setenv("TOKEN_FILE", str(secret))
    monkeypatch.setenv("TOKEN", "ignored")
    assert env_str("TOKEN", "") == "s3cret"


def test_lists_are_comma_separated(monkeypatch):
    monkeypatch.setenv("HOSTS", "a, b,,c")
    assert env_list("HOSTS", []) == ["a", "b", "c"]


def test_database_urls_become_postgres_settings():
    conf = postgres_from_url("postgres://u:p%40ss@db.internal:6543/holdfast?sslmode=require")
    assert conf["NAME"] == "holdfast" and conf["USER"] == "u" and conf["PASSWORD"] == "p@ss"
    assert conf["HOST"] == "db.internal" and conf["PORT"] == "6543"
    assert conf["OPTIONS"] == {"sslmode": "require"}
    with pytest.raises(ImproperlyConfigured, match="must start with postgres://"):
        postgres_from_url("mysql://x/y")
    with pytest.raises(ImproperlyConfigured, match="names no database"):
        postgres_from_url("postgres://host/")


@pytest.mark.django_db
def test_the_database_is_configured_for_the_engine():
    if connection.vendor == "postgresql":
        # statement_timestamp(), partial indexes and data-modifying CTEs: 15+ is supported.
        assert connection.pg_version >= 150000
        return
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA journal_mode")
        assert cursor.fetchone()[0] == "wal"
    assert connection.settings_dict["OPTIONS"]["transaction_mode"] == "IMMEDIATE"
