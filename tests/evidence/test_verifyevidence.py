"""manage.py verifyevidence: a downloaded file's hash, HMAC and the export on record."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from accounts.privacy import mask_text
from accounts.services import audit_record
from evidence.bundle import EXPORT_ACTION
from evidence.services import exports_of

pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")


@pytest.fixture
def downloaded(client, tenant, make_operator, harness, tmp_path):
    run = harness.start("flow", {"order_id": "o-9"})
    harness.advance(run)
    client.force_login(make_operator(tenant, "viewer", username="vic"))
    path = tmp_path / "evidence.json"
    path.write_bytes(client.get(f"/runs/{run.id}/evidence.json").content)
    return path


def _verify(path) -> str:
    out = StringIO()
    call_command("verifyevidence", str(path), stdout=out)
    return out.getvalue()


def test_a_file_as_downloaded_verifies_and_its_export_is_named(downloaded):
    document = json.loads(downloaded.read_text())
    said = _verify(downloaded)
    assert f"sha256 {document['sha256']}" in said
    assert "matches the one the file states" in said and "made by this deployment" in said
    assert "by user:vic as json" in said


def test_a_changed_file_fails(downloaded):
    document = json.loads(downloaded.read_text())
    document["bundle"]["run"]["status"] = "failed_after_effect"
    downloaded.write_text(json.dumps(document))
    with pytest.raises(CommandError, match="does not verify"):
        _verify(downloaded)


def test_a_file_that_is_no_evidence_is_refused(tmp_path):
    path = tmp_path / "other.json"
    path.write_text("[1, 2]")
    with pytest.raises(CommandError, match="not an evidence file"):
        _verify(path)


def test_an_export_is_found_by_a_hash_holding_a_card_like_digit_run(tenant):
    # A digest with a Luhn-valid run of 16 digits: inside a word, never taken for a card.
    digest = "ab" + "4242424242424242" + "c" * 46
    assert mask_text(digest) == digest
    audit_record(
        tenant=tenant,
        actor="user:vic",
        action=EXPORT_ACTION,
        object_type="run",
        object_id="r-1",
        after={"format": "json", "sha256": digest},
    )
    assert len(exports_of("r-1", digest)) == 1
