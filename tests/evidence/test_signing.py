"""The hash on an evidence bundle is what the documented command prints, and only this
deployment's key makes its HMAC."""

from __future__ import annotations

import json
import subprocess

import pytest

from evidence.signing import sign, verify, verify_command

pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")

AWKWARD = {
    "text": 'Zoë paid 45.00 € — «quoted» 日本 \u2028 tab\there "q" \\ 😀',
    "numbers": [0, -1, 1.5, 1.0, 0.1, 1e-7, 12345678901234567],
    "nested": {"b": None, "a": [True, False], "é": {}},
}


def _download(viewer, run, tmp_path):
    response = viewer.get(f"/runs/{run.id}/evidence.json")
    path = tmp_path / response["Content-Disposition"].split('filename="')[1].rstrip('"')
    path.write_bytes(response.content)
    return path, json.loads(response.content)


def _run_command(path) -> str:
    command = verify_command(path.name)
    done = subprocess.run(
        ["sh", "-c", command], cwd=path.parent, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


@pytest.fixture
def viewer(client, tenant, make_operator):
    client.force_login(make_operator(tenant, "viewer"))
    return client


def test_the_documented_command_prints_the_hash_of_a_downloaded_bundle(
    viewer, approved_run, tmp_path
):
    path, document = _download(viewer, approved_run, tmp_path)
    assert _run_command(path) == document["sha256"]
    assert verify_command(path.name) in document["verify"]


def test_the_command_holds_for_any_text_and_number(tmp_path, settings):
    signature = sign(AWKWARD)
    path = tmp_path / "awkward.json"
    path.write_text(json.dumps({"bundle": AWKWARD}, indent=2, ensure_ascii=False))
    assert _run_command(path) == signature.sha256


def test_a_changed_bundle_no_longer_verifies(viewer, approved_run, tmp_path):
    _, document = _download(viewer, approved_run, tmp_path)
    assert verify(document).sha256_matches and verify(document).hmac_matches
    document["bundle"]["approvals"][0]["decision"]["by"] = "user:mallory"
    assert not verify(document).sha256_matches and not verify(document).hmac_matches
    # Whoever changes it can state the new SHA-256, but not make the HMAC.
    document["sha256"] = verify(document).sha256
    verdict = verify(document)
    assert verdict.sha256_matches and not verdict.hmac_matches


def test_a_rotated_key_still_verifies_what_it_signed(settings):
    document = {"bundle": AWKWARD}
    document["sha256"], document["hmac_sha256"] = sign(AWKWARD)
    settings.SECRET_KEY_FALLBACKS = [settings.SECRET_KEY]
    settings.SECRET_KEY = "a-new-key-" + "x" * 50
    assert verify(document).hmac_matches
    settings.SECRET_KEY_FALLBACKS = []
    assert not verify(document).hmac_matches
