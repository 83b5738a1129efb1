"""An operator's own preferences: the time zone their times are shown in."""

from __future__ import annotations

from datetime import UTC

import pytest

from accounts.models import AuditEntry, Operator

pytestmark = pytest.mark.django_db


@pytest.fixture
def ann(client, tenant, make_operator):
    user = make_operator(tenant, "viewer", username="ann")
    client.force_login(user)
    return user.operator


def test_an_operator_chooses_a_time_zone_and_it_is_audited(client, ann):
    response = client.post("/accounts/preferences/", {"time_zone": "Europe/Berlin"})
    assert response.status_code == 302 and response["Location"] == "/accounts/preferences/"
    ann.refresh_from_db()
    assert ann.time_zone == "Europe/Berlin"
    entry = AuditEntry.objects.get(action="operator.time_zone")
    assert (entry.actor, entry.object_type, entry.object_id) == (
        "user:ann",
        "operator",
        str(ann.pk),
    )
    assert entry.before == {"time_zone": "UTC"}
    assert entry.after == {"time_zone": "Europe/Berlin", "source": "chosen"}
    page = client.get("/accounts/preferences/").content.decode()
    assert "Times are now shown in Europe/Berlin." in page
    assert '<option value="Europe/Berlin" selected>' in page


def test_an_unknown_zone_is_refused_in_plain_words_and_kept_in_the_form(client, ann):
    response = client.post("/accounts/preferences/", {"time_zone": "Mars/Olympus"})
    assert response.status_code == 400
    page = response.content.decode()
    assert (
        '<p class="field-error" id="time-zone-error" role="alert">“Mars/Olympus” is not a time '
        "zone Holdfast knows: choose one from the list, a region and a city such as "
        "Europe/Berlin.</p>"
    ) in page
    assert 'aria-describedby="time-zone-error"' in page
    assert '<option value="Mars/Olympus" selected>' in page
    ann.refresh_from_db()
    assert ann.time_zone == "UTC" and not AuditEntry.objects.exists()


def test_another_operators_zone_cannot_be_changed(client, ann, tenant, make_operator):
    bob = make_operator(tenant, "admin", username="bob").operator
    client.post(
        "/accounts/preferences/",
        {"time_zone": "Asia/Tokyo", "operator": bob.pk, "user": bob.user_id},
    )
    assert Operator.objects.get(pk=bob.pk).time_zone == "UTC"
    assert Operator.objects.get(pk=ann.pk).time_zone == "Asia/Tokyo"
    assert list(AuditEntry.objects.values_list("object_id", flat=True)) == [str(ann.pk)]


def test_the_browsers_zone_is_taken_once_while_none_was_chosen(client, ann):
    # The first page an operator opens offers its browser's zone (templates/base.html).
    page = client.get("/runs/").content.decode()
    assert "js/zone.js" in page
    answer = client.post(
        "/accounts/preferences/", {"time_zone": "America/New_York", "source": "browser"}
    )
    assert answer.status_code == 204
    ann.refresh_from_db()
    assert ann.time_zone == "America/New_York"
    assert AuditEntry.objects.get().after == {"time_zone": "America/New_York", "source": "browser"}
    assert "js/zone.js" not in client.get("/runs/").content.decode()
    # Another browser of the same operator does not override it.
    again = client.post("/accounts/preferences/", {"time_zone": "Asia/Tokyo", "source": "browser"})
    assert again.status_code == 200
    ann.refresh_from_db()
    assert ann.time_zone == "America/New_York" and AuditEntry.objects.count() == 1


def test_a_chosen_utc_is_never_replaced_by_the_browsers(client, ann):
    client.post("/accounts/preferences/", {"time_zone": "UTC"})
    assert AuditEntry.objects.get().after == {"time_zone": "UTC", "source": "chosen"}
    assert "js/zone.js" not in client.get("/runs/").content.decode()
    client.post("/accounts/preferences/", {"time_zone": "Europe/Paris", "source": "browser"})
    ann.refresh_from_db()
    assert ann.time_zone == "UTC"


def test_times_are_local_with_utc_on_hover(client, tenant, make_operator):
    from tests.harness import Harness

    client.force_login(make_operator(tenant, "viewer", time_zone="Asia/Tokyo"))
    run = Harness(tenant).start("flow")
    page = client.get(f"/runs/{run.id}/").content.decode()
    assert "JST" in page
    # The start time: in Tokyo on the page, the instant in UTC on hover.
    created = run.created_at.astimezone(UTC)
    assert f'title="{created:%Y-%m-%dT%H:%M:%S}.' in page and "+00:00" in page


def test_the_navigation_links_to_the_preferences(client, ann):
    page = client.get("/runs/").content.decode()
    assert 'href="/accounts/preferences/"' in page
