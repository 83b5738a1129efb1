"""docs/api.md's "Approve from chat", run as written with curl and jq against a live server."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import Group

from accounts.models import ApiToken, AuditEntry
from approvals.models import ApprovalAuthority
from tests.approvals.conftest import World
from tests.harness import ORDER, point_at_sandbox, refund_harness

pytestmark = [
    pytest.mark.django_db(transaction=True, databases="__all__"),
    pytest.mark.skipif(
        not (shutil.which("curl") and shutil.which("jq")), reason="needs curl and jq"
    ),
]

DOCS = Path(django_settings.BASE_DIR) / "docs" / "api.md"


def walkthrough() -> str:
    """The first shell block under the "Approve from chat" heading."""
    text = DOCS.read_text()
    section = text.split("\n## Approve from chat\n", 1)[1]
    return re.search(r"```sh\n(.*?)```", section, re.S).group(1)


def test_the_walkthrough_names_its_server_and_token_on_their_own_lines():
    script = walkthrough()
    assert re.search(r"^API=http://127\.0\.0\.1:8000/api/v1$", script, re.M)
    assert re.search(r"^TOKEN=hft_\.\.\.", script, re.M)


def test_approve_from_chat_works_as_documented(
    live_server, sandbox, settings, tenant, make_operator
):
    point_at_sandbox(settings, sandbox)
    order = sandbox.get(f"/shop/orders/{ORDER}").json()
    world = World(refund_harness(tenant), sandbox, order, tenant)
    ann = make_operator(tenant, "approver", username="ann")
    ApprovalAuthority.objects.update_or_create(
        tenant=tenant,
        group=Group.objects.get(name="approver"),
        currency="eur",
        defaults={"max_amount": 50_000},
    )
    secret = ApiToken.issue(
        owner=ann,
        name="chat",
        scopes=[ApiToken.SCOPE_APPROVALS_READ, ApiToken.SCOPE_APPROVALS_DECIDE],
    )[1]
    run = world.start_refund(requested_by="user:requester")
    assert world.harness.advance(run) == "suspended:waiting_for_approval"
    approval = world.waiting_approval(run)

    # The reader's two values, and nothing else of the block, replaced.
    script = re.sub(r"^API=.*$", f"API={live_server.url}/api/v1", walkthrough(), flags=re.M)
    script = re.sub(r"^TOKEN=.*$", f"TOKEN={secret}", script, flags=re.M)
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()

    listed, read, decided, again = (
        json.loads(lines[0]),
        json.loads(lines[1]),
        json.loads(lines[2]),
        lines[3],
    )
    assert listed == {
        "id": approval.pk,
        "tool": "issue_refund",
        "amount": "60.00 EUR",
        "preview": approval.preview,
        "may_decide": True,
    }
    assert read["args"]["order_id"] == ORDER and read["requested_by"] == "user:requester"
    assert decided["status"] == "approved"
    assert decided["decision"]["by"] == "user:ann"
    assert decided["decision"]["note"] == "approved in #refunds"
    assert again == "not decided: user:ann already approved it"
    assert len(lines) == 4

    approval.refresh_from_db()
    assert approval.status == "approved" and approval.decided_by_name == "user:ann"
    entry = AuditEntry.objects.get(action="approval.approve")
    assert entry.actor == "user:ann" and entry.after["token"].startswith("token:chat (")
