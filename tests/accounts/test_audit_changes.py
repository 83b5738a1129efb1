"""The audit's before → after, field by field (accounts.audit_changes and its tag)."""

from __future__ import annotations

import pytest
from django.template import Context, Template

from accounts.audit_changes import SHORT, audit_changes
from accounts.services import audit_record


def _lines(before, after):
    return [
        (c.field, c.kind, c.old and c.old.full, c.new and c.new.full)
        for c in audit_changes(before, after)
    ]


def test_only_the_fields_that_differ_are_listed_old_then_new():
    before = {"status": "running", "attempts": 1, "agent": "refund_support"}
    after = {"status": "cancelled", "attempts": 1, "agent": "refund_support"}
    assert _lines(before, after) == [("status", "changed", "running", "cancelled")]


def test_added_and_removed_fields_say_so():
    assert _lines({"note": "first"}, {"reason": "late"}) == [
        ("reason", "added", None, "late"),
        ("note", "removed", "first", None),
    ]
    assert _lines(None, {"status": "open"}) == [("status", "added", None, "open")]


def test_nested_values_are_compact_json():
    after = {"limits": {"EUR": 10000, "USD": 5000}, "scopes": ["runs:read"]}
    assert _lines({}, after) == [
        ("limits", "added", None, '{"EUR":10000,"USD":5000}'),
        ("scopes", "added", None, '["runs:read"]'),
    ]


def test_a_long_value_is_cut_and_keeps_the_whole():
    (change,) = audit_changes({}, {"effect_key": "k" * 200})
    assert change.new.cut and len(change.new.short) == SHORT and change.new.short.endswith("…")
    assert change.new.full == "k" * 200


def test_values_go_through_the_masking_rule():
    (email, token) = audit_changes(
        {"email": "ann@example.com"}, {"email": "bob@example.com", "api_token": "hft_" + "x" * 30}
    )
    assert (email.old.full, email.new.full) == ("••••", "••••")
    assert token.new.full == "••••"
    (note,) = audit_changes({}, {"note": "refund to ann@example.com"})
    assert note.new.full == "refund to ••••@example.com"


def test_a_value_that_is_not_a_set_of_fields_is_one_change():
    assert _lines(["a"], ["a", "b"]) == [("", "changed", '["a"]', '["a","b"]')]
    assert _lines(None, None) == []


@pytest.mark.django_db
def test_the_audit_page_shows_field_by_field_changes(client, tenant, make_operator):
    client.force_login(make_operator(tenant, "admin"))
    audit_record(
        tenant=tenant,
        actor="user:ann",
        action="run.cancel",
        object_type="run",
        object_id="0d6f3a52-7a3f-4a47-9ab9-2f0a7a0f6d11",
        before={"status": "running", "attempts": 1},
        after={"status": "cancelled", "attempts": 1, "reason": "x" * 100},
    )
    page = client.get("/audit/").content.decode()
    assert (
        '<span class="field">status</span>: <code>running</code> → <code>cancelled</code>' in page
    )
    assert "attempts" not in page
    assert f'<summary title="{"x" * 100}"><code>{"x" * (SHORT - 1)}…</code></summary>' in page
    assert "{&#x27;status&#x27;" not in page  # no Python dict


def test_the_tag_escapes_what_it_shows():
    class Entry:
        before = None
        after = {"note": "<script>alert(1)</script>"}

    html = Template("{% load audit %}{% changes entry %}").render(Context({"entry": Entry()}))
    assert "<script>" not in html and "&lt;script&gt;" in html
