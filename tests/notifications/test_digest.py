"""An operator who chose the digest gets one email per period listing what waited."""

from __future__ import annotations

from datetime import timedelta

import pytest

from notifications.models import DigestEntry, NotificationPreference
from notifications.services import digests_start

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_digest_collects_the_period_and_is_sent_once(world, people, settings):
    settings.HOLDFAST_DIGEST_SECONDS = 3600
    NotificationPreference.objects.create(user=people["ann"], delivery="digest")
    first = world.pending_approval(order_id="ord_1001")
    second = world.pending_approval(order_id="ord_1002")
    world.drive_notifications()

    # Held, not sent; nothing is digested while its period lasts.
    assert world.messages() == []
    assert DigestEntry.objects.filter(user=people["ann"]).count() == 2
    assert digests_start() == 0

    # The period ends.
    DigestEntry.objects.update(
        created_at=DigestEntry.objects.first().created_at - timedelta(hours=1)
    )
    assert digests_start() == 1
    assert digests_start() == 0
    world.drive_notifications()
    assert digests_start() == 0
    world.drive_notifications()

    digest_runs = [r for r in world.notify_runs() if r.agent_name == "notify_digest"]
    assert len(digest_runs) == 1 and digest_runs[0].status == "completed"
    assert digest_runs[0].request_id.startswith(f"digest:{people['ann'].pk}:")
    assert world.recipients() == ["ann@ops.example"]
    [message] = world.messages()
    assert message["subject"] == "Holdfast digest: 2 notice(s) waited"
    assert f"/approvals/{first.pk}/" in message["body"]
    assert f"/approvals/{second.pk}/" in message["body"]
    assert message["body"].count("Approval needed: issue_refund, 60.00 EUR") == 2
