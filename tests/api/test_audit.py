"""/api/v1/audit: the tenant's audit log as its page shows it, masked, paged by cursor."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from accounts.models import ApiToken, AuditEntry
from accounts.services import audit_record

pytestmark = pytest.mark.django_db(databases="__all__")

FIELDS = {
    "id",
    "created_at",
    "actor",
    "action",
    "object_type",
    "object_id",
    "before",
    "after",
    "remote_addr",
}


@pytest.fixture
def admin(tenant, make_operator):
    return make_operator(tenant, "admin", username="ada")


@pytest.fixture
def auditor(admin, api_as):
    return api_as(admin)


def _entry(tenant, action="run.cancel", actor="user:ann", object_id="r-1", **fields):
    return audit_record(
        tenant=tenant,
        actor=actor,
        action=action,
        object_type=fields.pop("object_type", "run"),
        object_id=object_id,
        **fields,
    )


def _ids(response) -> list[int]:
    assert response.status_code == 200, response.content
    return [entry["id"] for entry in response.json()["items"]]


def test_the_log_is_the_tenants_newest_first(auditor, tenant, other_tenant):
    first = _entry(tenant, before={"status": "sleeping"}, after={"status": "cancelled"})
    second = _entry(tenant, action="run.retry_now")
    _entry(other_tenant, action="run.cancel", actor="user:theirs")
    response = auditor.get("/audit")
    assert _ids(response) == [second.pk, first.pk]
    item = response.json()["items"][1]
    assert set(item) == FIELDS
    assert item["before"] == {"status": "sleeping"} and item["after"] == {"status": "cancelled"}
    assert item["actor"] == "user:ann" and item["object_type"] == "run"


def test_the_log_filters_as_its_page_does_and_by_time(auditor, tenant):
    now = timezone.now()
    cancel = _entry(tenant, actor="user:Ann", object_id="r-1")
    retry = _entry(tenant, action="run.retry_now", actor="user:bob", object_id="r-2")
    case = _entry(tenant, action="case.resolve", object_type="case", object_id="7")
    AuditEntry.objects.filter(pk=case.pk).update(created_at=now - timedelta(days=2))
    cases = [
        ({"actor": "ann"}, [cancel, case]),
        ({"action": "run.retry_now"}, [retry]),
        ({"object_id": "r-1"}, [cancel]),
        ({"object_type": "case"}, [case]),
        ({"created_after": (now - timedelta(days=1)).isoformat()}, [retry, cancel]),
        ({"created_before": (now - timedelta(days=1)).isoformat()}, [case]),
    ]
    for params, expected in cases:
        assert _ids(auditor.get("/audit", params)) == [e.pk for e in expected], params


def test_personal_data_is_masked_as_on_the_page(auditor, tenant):
    entry = _entry(tenant, action="case.resolve")
    # Written before masking applied to it, say: the API masks what it shows again.
    AuditEntry.objects.filter(pk=entry.pk).update(
        after={"email": "ann@example.com", "note": "card 4242 4242 4242 4242, ann@example.com"}
    )
    after = auditor.get("/audit").json()["items"][0]["after"]
    assert "ann@example.com" not in str(after)
    assert "4242 4242 4242 4242" not in str(after)
    assert after["note"].endswith("@example.com")


def test_pages_neither_repeat_nor_skip_an_entry_while_entries_are_written(auditor, tenant):
    existing = [_entry(tenant, object_id=f"r-{i}") for i in range(8)]
    same = timezone.now() - timedelta(minutes=1)
    AuditEntry.objects.filter(pk__in=[e.pk for e in existing[3:6]]).update(created_at=same)
    seen: list[int] = []
    cursor = None
    for page in range(10):
        response = auditor.get("/audit", {"limit": 3, **({"cursor": cursor} if cursor else {})})
        seen.extend(_ids(response))
        cursor = response.json()["next_cursor"]
        _entry(tenant, object_id=f"new-{page}")
        if cursor is None:
            break
    assert len(seen) == len(set(seen)) == 8
    assert set(seen) == {e.pk for e in existing}


def test_a_cursor_is_a_position_so_it_pages_any_filter_from_there(auditor, tenant):
    # A cursor is a position (time, id), not a filter: the same cursor under other
    # filters pages that list from the same instant.
    entries = [_entry(tenant, object_id=f"r-{i}") for i in range(3)]
    cursor = auditor.get("/audit", {"limit": 1}).json()["next_cursor"]
    rest = _ids(auditor.get("/audit", {"cursor": cursor, "actor": "ann"}))
    assert rest == [entries[1].pk, entries[0].pk]


def test_reading_the_log_needs_the_scope(admin, api_as, tenant):
    _entry(tenant)
    scopes = [s for s in ApiToken.SCOPES if s != ApiToken.SCOPE_AUDIT_READ]
    response = api_as(admin, scopes=scopes).get("/audit")
    assert response.status_code == 403
    assert response.json() == {"error": "this token may not do audit:read"}


@pytest.mark.parametrize("role", ["viewer", "operator", "approver", "reconciler"])
def test_reading_the_log_needs_the_permission(tenant, make_operator, api_as, role):
    response = api_as(make_operator(tenant, role, username="pat")).get("/audit")
    assert response.status_code == 403
    assert response.json() == {"error": "this token's owner, pat, may not read the audit log"}
