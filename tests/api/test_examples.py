"""docs/api.md's examples, sent as written: each curl gets the status its ``# →`` line says."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from accounts.models import ApiToken, AuditEntry
from agentruns.models import Run

pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")

DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"


def _examples() -> list[tuple[list[str], int]]:
    """(curl's arguments, the status expected) of every curl in the Examples section."""
    text = DOC.read_text().split("## Examples", 1)[1]
    block = re.search(r"```sh\n(.*?)```", text, re.S).group(1)
    examples = []
    command: list[str] = []
    for line in block.splitlines():
        if command and line.startswith("# →"):
            status = int(re.match(r"# → (\d{3})\b", line).group(1))
            examples.append((shlex.split(" ".join(command)), status))
            command = []
        elif line.startswith("curl ") or command:
            command.append(line.removesuffix("\\"))
    return examples


def _send(client, argv: list[str], variables: dict[str, str]):
    assert argv[0] == "curl"
    method, headers, data, url = "GET", {}, None, None
    args = iter(argv[1:])
    for arg in args:
        if arg == "-s":
            continue
        if arg == "-X":
            method = next(args)
        elif arg == "-H":
            name, _, value = next(args).partition(": ")
            headers[name] = value
        elif arg == "-d":
            data = next(args)
        else:
            url = arg
    for name, value in variables.items():
        url = url.replace(f"${name}", value)
        headers = {k: v.replace(f"${name}", value) for k, v in headers.items()}
    assert "$" not in url, f"an example names a variable the test does not know: {url}"
    parts = urlsplit(url)
    meta = {
        f"HTTP_{k.upper().replace('-', '_')}": v for k, v in headers.items() if k != "Content-Type"
    }
    return client.generic(
        method,
        f"{parts.path}?{parts.query}" if parts.query else parts.path,
        (data or "").encode(),
        content_type=headers.get("Content-Type", "application/octet-stream"),
        **meta,
    )


def test_the_examples_are_followed_as_written(client, tenant, make_operator):
    owner = make_operator(tenant, "admin", username="admin")
    secret = ApiToken.issue(owner=owner, name="helpdesk")[1]
    examples = _examples()
    assert len(examples) >= 10
    variables = {"TOKEN": secret, "BASE": "http://127.0.0.1:8000/api/v1"}
    for argv, status in examples:
        response = _send(client, argv, variables)
        assert response.status_code == status, (argv, response.content)
        assert response["Content-Type"] == "application/json"
        body = response.json()
        if "RUN_ID" not in variables and status == 201:
            variables["RUN_ID"] = body["id"]
        if body.get("next_cursor"):
            variables["NEXT_CURSOR"] = body["next_cursor"]
    run = Run.objects.get(pk=variables["RUN_ID"])
    assert run.status == "cancelled_no_effect" and run.requested_by == "user:admin"
    assert {"run.start", "run.cancel"} <= set(AuditEntry.objects.values_list("action", flat=True))
