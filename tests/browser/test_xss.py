"""Script in model output, tool arguments, provider errors and evidence notes stays text
in a real browser: on first load, in htmx loads and swaps, and when it arrives by push
over a live socket. Nothing runs (no dialog, no ``window.__xss``, no page error, no
request an injected element would make) and every payload is on the page as text.

The records are made directly in the database, as the engine and the dashboard leave
them: which text reaches which field is the point here, not how a run gets there.
"""

from __future__ import annotations

import json
import socket
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from urllib.parse import urlparse

import pytest
from django.conf import settings
from django.utils import timezone
from playwright.sync_api import Locator, expect

from accounts.models import AuditEntry
from accounts.services import audit_record
from agentruns.doorbell import doorbell_ring
from agentruns.models import Run, RunEvent, RunStatus, Step, StepKind, StepStatus
from agentruns.services import get_registry
from approvals.models import Approval, ApprovalStatus
from reconciliation.models import CaseStatus, ProviderLookup, ReconciliationCase
from tests.harness import SCREENSHOTS

pytestmark = [pytest.mark.django_db(transaction=True, databases="__all__"), pytest.mark.browser]

# Each sets window.__xss and opens a dialog if it ever runs.
SCRIPT = "<script>window.__xss=1;alert(1)</script>"
IMG = '"><img src=x onerror=window.__xss=2;alert(2)>'
SVG = "<svg/onload=window.__xss=3;alert(3)>"
JS_URL = "javascript:alert(4)"
TEMPLATE = "{{7*7}} ${7*7} {% now 'Y' %}"
HTMX = '<div hx-get="/x" hx-trigger="load">htmx</div>'
TEXTAREA = "</textarea><script>window.__xss=5;alert(5)</script>"
JSON_BREAK = "</script><script>window.__xss=6;alert(6)</script>"
PAYLOADS = [SCRIPT, IMG, SVG, JS_URL, TEMPLATE, HTMX, TEXTAREA, JSON_BREAK]
ALL = " ".join(PAYLOADS)
# Through the masking rule first (an address, a card number): still text afterwards.
MASKED = "<img src=x onerror=window.__xss=7;alert(7)>grace@example.com 4242 4242 4242 4242"
MASKED_SHOWN = "<img src=x onerror=window.__xss=7;alert(7)>••••@example.com •••• 4242"
IN_THE_CLEAR = ("grace@example.com", "4242 4242 4242 4242")
# The admin's inline of a case's observations.
ADMIN_LOOKUPS = "#lookups-group"

PROVIDER_SETTINGS = ("PAYMENTS_API_BASE", "SHOP_API_BASE")
PASSWORD = "correct horse battery"
# Every role of a tenant: the operator who reads these pages may do everything in it.
ROLES = ("viewer", "operator", "approver", "reconciler", "admin")


def as_json(text: str) -> str:
    """``text`` as a JSON string shows it on a page (a step's input, a lookup's evidence)."""
    return json.dumps(text, ensure_ascii=False)[1:-1]


ALL_AS_JSON = [as_json(p) for p in PAYLOADS]


@pytest.fixture(scope="module")
def unreachable_provider():
    """The payments provider refuses every connection: an approval card's "state now"
    becomes a provider error, and a lookup fails. Set before the server forks."""
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        url = f"http://127.0.0.1:{bound.getsockname()[1]}"
        saved = {name: getattr(settings, name) for name in PROVIDER_SETTINGS}
        for name in PROVIDER_SETTINGS:
            setattr(settings, name, url)
        yield url
        for name, value in saved.items():
            setattr(settings, name, value)


@pytest.fixture(scope="module")
def live_server_url(unreachable_provider, live_server_url):
    return live_server_url


@dataclass
class Payloads:
    run: Run
    model_step: Step
    tool_step: Step
    approval: Approval
    earlier_approval: Approval
    case: ReconciliationCase
    resolved_case: ReconciliationCase
    audit: AuditEntry


def _run(tenant, **fields) -> Run:
    refund_support = get_registry().latest("refund_support")
    return Run.objects.create(
        tenant=tenant,
        **{
            "agent_name": refund_support.name,
            "agent_version": refund_support.version,
            "request_id": f"req-{uuid.uuid4()}",
            **fields,
        },
    )


def _step(run: Run, seq: int, kind: str, name: str, status: str, **fields) -> Step:
    """A step as the engine records it, named by its place, kind and name."""
    step_id = f"{seq:04d}.{kind}.{name}"
    return Step.objects.create(
        run=run, seq=seq, step_id=step_id, kind=kind, name=name, status=status, **fields
    )


def _refund_step(run: Run, seq: int, status: str, args: dict, **fields) -> Step:
    return _step(
        run, seq, StepKind.TOOL, "issue_refund", status, is_effect=True, input=args, **fields
    )


def _case(step: Step, **fields) -> ReconciliationCase:
    """The case of an effect step whose outcome nobody could tell."""
    return ReconciliationCase.objects.create(
        tenant=step.run.tenant,
        run=step.run,
        step=step,
        step_id_label=step.step_id,
        effect_key=step.effect_key,
        **fields,
    )


def _event(run: Run, step_id: str = "", kind: str = "step_recorded") -> RunEvent:
    event = RunEvent.objects.create(
        run=run, type=kind, state_version=run.state_version, step_id=step_id
    )
    doorbell_ring(run.id)  # as the engine's Store does after a commit that wrote an event
    return event


@pytest.fixture
def payloads(tenant) -> Payloads:
    """One run carrying every payload, in every field a person reads."""
    now = timezone.now()
    run = _run(
        tenant,
        request_id=f"req {SVG} {HTMX}",
        requested_by=SCRIPT,
        input={"order_id": JSON_BREAK, "question": ALL, "customer_email": "grace@example.com"},
        status=RunStatus.EFFECT_UNKNOWN,
        outcome_code=JS_URL,  # the run list links to the runs that ended so
        outcome_detail=f"{MASKED} {ALL}",
        output={"answer": ALL},
        current_step=f"{IMG} {TEXTAREA}",
    )
    model_step = _step(
        run,
        1,
        StepKind.MODEL,
        SVG,
        StepStatus.SUCCEEDED,
        input={"messages": [{"role": "user", "content": ALL}]},
        result={"text": ALL, "note": MASKED},
        model_provider=SCRIPT,
        model_id=IMG,
        prompt_version=TEMPLATE,
        validation=[{"name": SVG, "valid": False, "error": TEXTAREA}],
    )
    tool_args = {
        "order_id": JSON_BREAK,
        "payment_intent": IMG,
        "reason": ALL,
        "amount": 6000,
        "currency": "eur",
        "note": MASKED,
    }
    tool_step = _refund_step(
        run,
        2,
        StepStatus.UNKNOWN,
        tool_args,
        effect_key=f"ek_{SVG}",
        provider_reference=IMG,
        attempts=2,
        last_error_class=SCRIPT,
        last_error=f"{MASKED} {ALL}",
        recovery_log=[
            {"action": "send", "attempt": 1, "verdict": SCRIPT, "error_class": SVG},
            {"action": "send", "attempt": 2, "message": MASKED},
            {"action": "lookup", "outcome": HTMX, "detail": ALL, "reason": TEXTAREA},
        ],
    )
    settled_step = _refund_step(
        run,
        3,
        StepStatus.SUCCEEDED,
        tool_args,
        effect_key=f"ek_settled_{uuid.uuid4().hex[:8]}",
        result={"id": JSON_BREAK, "status": ALL},
    )
    _refund_step(run, 4, StepStatus.PLANNED, tool_args)
    approval_fields = {
        "tenant": tenant,
        "run": run,
        "step_id": "0004.tool.issue_refund",
        "args": {**tool_args, "customer_email": "grace@example.com"},
        "args_hash": "a" * 64,
        "effect_key": f"ek_approval_{uuid.uuid4().hex[:8]}",
        "requested_by": SCRIPT,
        "resource": f"payment_intent:{SVG} {HTMX}",
        "resource_state": {"status": TEXTAREA, "amount_received": 8900, "currency": "eur"},
        "resource_fingerprint": "f" * 64,
        "preview": ALL,
        "amount": 6000,
        "currency": "eur",
        "expires_at": now + timedelta(hours=1),
    }
    earlier_approval = Approval.objects.create(
        **{**approval_fields, "tool": IMG},
        status=ApprovalStatus.INVALIDATED,
        decided_by_name=SVG,
        decided_at=now,
        note=MASKED,
        invalidated_reason=ALL,
    )
    approval = Approval.objects.create(
        **{**approval_fields, "tool": "issue_refund"},
        replaces=earlier_approval,
        changes=[HTMX, SCRIPT],
        provider_refusal=f"{SVG} {JSON_BREAK}",
    )
    case = _case(
        tool_step,
        tool="issue_refund",
        provider=IMG,
        recovery=TEMPLATE,
        can_look_up=True,
        args=tool_args,
        request={"payment_intent": IMG, "amount": 6000, "metadata": {"order_id": JSON_BREAK}},
        approval_id=earlier_approval.pk,
        amount=6000,
        currency="eur",
        reason=ALL,
        opened_at=now - timedelta(minutes=5),
    )
    ProviderLookup.objects.create(
        case=case,
        method=ProviderLookup.Method.OPERATOR,
        actor=SCRIPT,
        outcome="not_found",
        provider_reference=HTMX,
        evidence={"seen_at": JS_URL},
        note=f"{MASKED} {ALL}",
    )
    ProviderLookup.objects.create(
        case=case,
        method=ProviderLookup.Method.AUTOMATIC,
        actor="system",
        outcome="inconclusive",
        evidence={"error": f"ConnectionError: {ALL}"},
        note="the provider could not be asked",
    )
    resolved_case = _case(
        settled_step,
        tool=SVG,
        provider=TEXTAREA,
        reason=ALL,
        status=CaseStatus.RESOLVED,
        resolution="happened",
        resolved_by=IMG,
        resolved_at=now,
        resolution_note=MASKED,
        outcome_summary=ALL,
    )
    audit = audit_record(
        tenant=tenant,
        actor=SCRIPT,
        action="approval.reject",
        object_type="approval",
        object_id=str(earlier_approval.pk),
        before={"status": "pending"},
        after={"note": f"{MASKED} {ALL}"},
    )
    audit_record(
        tenant=tenant,
        actor=IMG,
        action="case.lookup.operator",
        object_type="case",
        object_id=str(case.pk),
        after={"note": ALL},
    )
    for step in (model_step, tool_step, settled_step):
        _event(run, step.step_id)
    return Payloads(
        run, model_step, tool_step, approval, earlier_approval, case, resolved_case, audit
    )


# --- what a page must not do --------------------------------------------------------


@dataclass
class Watch:
    """Everything a page did that an executed payload would make it do."""

    dialogs: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)
    # An injected <img src=x> or <div hx-get="/x"> would ask for these.
    injected_requests: list[str] = field(default_factory=list)


def _watch(page) -> Watch:
    watch = Watch()

    def on_dialog(dialog):
        watch.dialogs.append(f"{dialog.type}: {dialog.message}")
        dialog.dismiss()

    def on_console(message):
        # The browser asks for /favicon.ico on its own; the site has none.
        if message.type == "error" and not message.location["url"].endswith("/favicon.ico"):
            watch.console_errors.append(f"{message.text} ({message.location['url']})")

    def on_request(request):
        path = urlparse(request.url).path
        if path == "/x" or path.endswith("/x"):
            watch.injected_requests.append(request.url)

    page.on("dialog", on_dialog)
    page.on("pageerror", lambda error: watch.page_errors.append(str(error)))
    page.on("console", on_console)
    page.on("request", on_request)
    return watch


# Elements or attributes only a payload rendered as markup would put on these pages
# (the pages' own scripts all have a src; the admin's data scripts are JSON).
INJECTED_MARKUP = """() => ({
    inline_scripts: [...document.querySelectorAll("script:not([src])")]
        .filter(s => s.type !== "application/json").map(s => s.outerHTML),
    handlers: [...document.querySelectorAll("*")]
        .filter(e => [...e.attributes].some(a => a.name.startsWith("on")))
        .map(e => e.outerHTML.slice(0, 120)),
    images_of_x: document.querySelectorAll("img[src='x']").length,
    htmx_x: document.querySelectorAll("[hx-get='/x']").length,
    javascript_links: document.querySelectorAll("a[href^='javascript:' i]").length,
    xss: typeof window.__xss,
})"""
NOTHING_INJECTED = {
    "inline_scripts": [],
    "handlers": [],
    "images_of_x": 0,
    "htmx_x": 0,
    "javascript_links": 0,
    "xss": "undefined",
}


def _assert_inert(page, watch: Watch, where: str) -> None:
    """Nothing ran or was injected, and no address or card number is shown in the
    clear anywhere on the page."""
    # Every htmx load (a card's "state now", a swap) has answered and settled. (The
    # admin has no htmx: its page has loaded once goto returns.)
    if page.evaluate("typeof htmx !== 'undefined'"):
        page.wait_for_load_state("networkidle")
    page.wait_for_function("() => !document.querySelector('.htmx-request, .htmx-settling')")
    assert page.evaluate(INJECTED_MARKUP) == NOTHING_INJECTED, where
    assert watch.dialogs == [], where
    assert watch.page_errors == [], where
    assert watch.console_errors == [], where
    assert watch.injected_requests == [], where
    html = page.content()
    for clear in IN_THE_CLEAR:
        assert clear not in html, f"{where}: {clear} shown unmasked"


def _shows(page, texts: list[str], where: str | Locator = "body") -> None:
    """Each text is on the page as text: rendered, escaped, not dropped."""
    shown = page.locator(where) if isinstance(where, str) else where
    for text in texts:
        expect(shown).to_contain_text(text)


def _log_in(page, live_server_url, username: str, landing: str) -> None:
    page.goto(f"{live_server_url}/accounts/login/?next={landing}")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    expect(page).to_have_url(f"{live_server_url}{landing}")


def _open_details(page) -> None:
    page.evaluate("document.querySelectorAll('details').forEach(d => { d.open = true; })")


# --- first load, and the htmx loads and swaps of the pages ---------------------------


def test_payloads_stay_text_on_every_dashboard_page(
    page, live_server_url, tenant, make_operator, payloads, screenshot
):
    make_operator(tenant, *ROLES, username="ada")
    watch = _watch(page)
    _log_in(page, live_server_url, "ada", "/runs/")
    run, case = payloads.run, payloads.case

    # The run list: the request id, the current step, the outcome as a link.
    _shows(page, [f"req {SVG} {HTMX}", f"{IMG} {TEXTAREA}", "javascript:alert(4)"])
    outcome = page.locator(f"#run-{run.id} a.outcome")
    assert outcome.get_attribute("href") == "?outcome=javascript%3Aalert%284%29"
    _assert_inert(page, watch, "run list")

    # The run page: model output and evidence, tool arguments, the provider's error.
    page.goto(f"{live_server_url}/runs/{run.id}/")
    _shows(
        page,
        [
            f"by {SCRIPT}",
            MASKED_SHOWN,  # the outcome detail and the step's error, masked
            f"{SCRIPT}: {MASKED_SHOWN} {ALL}",
            f"0001.model.{SVG}",
            f"{SCRIPT} {IMG} · prompt {TEMPLATE}",
            f"{SVG}: invalid ({TEXTAREA})",
            f"ek_{SVG} → {IMG}",
            *ALL_AS_JSON,  # the model's result and the tool's input, as JSON
        ],
    )
    _assert_inert(page, watch, "run page")
    _open_details(page)
    screenshot("xss-run-page")

    # The inbox: the card's arguments, preview, refusal, what changed; its "state
    # now" is an htmx load whose answer is the provider's error.
    page.goto(f"{live_server_url}/approvals/")
    card = page.locator(f"#approval-{payloads.approval.pk}")
    expect(card.locator(".resource-now .problem")).to_contain_text(f"payment_intent:{SVG} {HTMX}")
    _shows(
        page,
        [ALL, JSON_BREAK, IMG, MASKED_SHOWN, TEXTAREA, f"{SVG} {JSON_BREAK}", HTMX],
        f"#approval-{payloads.approval.pk}",
    )
    _shows(page, [f"{SCRIPT}, "], f"#approval-{payloads.approval.pk} .facts")  # asked by
    _assert_inert(page, watch, "inbox")
    screenshot("xss-inbox")

    page.goto(f"{live_server_url}/approvals/?show=decided")
    _shows(page, [IMG, f"by {SVG}", ALL, f"Note: {MASKED_SHOWN}", f"Invalidated: {ALL}"])
    _assert_inert(page, watch, "inbox, decided")

    for approval in (payloads.approval, payloads.earlier_approval):
        page.goto(f"{live_server_url}/approvals/{approval.pk}/")
        _shows(page, [ALL, JSON_BREAK, MASKED_SHOWN if approval.note else TEXTAREA])
        _assert_inert(page, watch, f"approval {approval.pk}")
    # The earlier one's audit: the rejecting note, as the audit log holds it.
    _shows(page, [f"{SCRIPT} approval.reject: {MASKED_SHOWN} {ALL}"], "ul.audit")

    # The case queue, open and resolved: provider and tool names are filter options too.
    page.goto(f"{live_server_url}/reconciliation/")
    _shows(page, [IMG, "60.00 EUR"], "#case-table")
    assert page.locator("select[name=provider] option").all_text_contents()[1:] == sorted(
        [IMG, TEXTAREA]
    )
    _assert_inert(page, watch, "case queue")
    page.goto(f"{live_server_url}/reconciliation/?show=resolved")
    _shows(page, [SVG, TEXTAREA, f"it happened · {IMG}"], "#case-table")
    _assert_inert(page, watch, "case queue, resolved")

    # The case page: the reason, the stored request, the attempts' errors, the
    # evidence notes and the failed lookup's error.
    page.goto(f"{live_server_url}/reconciliation/{case.pk}/")
    case_texts = [
        ALL,
        f"{SCRIPT}: {MASKED_SHOWN} {ALL}",  # the step's last error
        f"send #1: {SCRIPT} ({SVG})",
        f"send #2 — {MASKED_SHOWN}",
        f"lookup: {HTMX} — {ALL} — {TEXTAREA}",
        f"recorded by {SCRIPT}",
        f"{MASKED_SHOWN} {ALL}",  # the operator's evidence note
        as_json(f"ConnectionError: {ALL}"),  # the automatic lookup's error
        f"issue_refund · {IMG} · {TEMPLATE}",
        *ALL_AS_JSON,
    ]
    _shows(page, case_texts, "#case-body")
    _assert_inert(page, watch, "case page")
    _open_details(page)
    screenshot("xss-case-page")
    # Look up now: the provider refuses the connection; the case body comes back by
    # an htmx swap with the new lookup, and everything above, still as text.
    page.locator("form[action$='/lookup'] button[type=submit]").click()
    expect(page.locator("#case-body .flash")).to_contain_text("The provider answered")
    expect(page.locator("#case-body ol.lookups > li")).to_have_count(3)
    _shows(page, case_texts, "#case-body")
    _assert_inert(page, watch, "case page after a lookup")

    page.goto(f"{live_server_url}/reconciliation/{payloads.resolved_case.pk}/")
    _shows(page, [f"— by {IMG}", MASKED_SHOWN, ALL, f"did {SVG} happen?"], "#case-body")
    _assert_inert(page, watch, "resolved case page")

    # The audit page: who did it and the before/after, as the log holds them.
    page.goto(f"{live_server_url}/audit/")
    _shows(page, [SCRIPT, IMG, "approval.reject", SVG, "••••@example.com"], "table.audit")
    _assert_inert(page, watch, "audit page")


def test_payloads_stay_text_on_the_admin_pages(
    browser, live_server_url, tenant, django_user_model, payloads
):
    django_user_model.objects.create_superuser(username="root", password=PASSWORD)
    context = browser.new_context(viewport={"width": 1200, "height": 800})
    page = context.new_page()
    watch = _watch(page)
    page.goto(f"{live_server_url}/admin/login/?next=/admin/")
    page.fill("input[name=username]", "root")
    page.fill("input[name=password]", PASSWORD)
    page.click("input[type=submit]")
    expect(page).to_have_url(f"{live_server_url}/admin/")

    run, case = payloads.run, payloads.case
    admin_pages = {
        f"agentruns/run/{run.pk}": [SCRIPT, MASKED_SHOWN, *ALL_AS_JSON, f"{IMG} {TEXTAREA}"],
        f"agentruns/step/{payloads.model_step.pk}": [IMG, TEMPLATE, *ALL_AS_JSON],
        f"agentruns/step/{payloads.tool_step.pk}": [
            f"{MASKED_SHOWN} {ALL}",
            as_json(MASKED_SHOWN),
            *ALL_AS_JSON,
        ],
        f"approvals/approval/{payloads.approval.pk}": [ALL, f"payment_intent:{SVG} {HTMX}"],
        f"approvals/approval/{payloads.earlier_approval.pk}": [MASKED_SHOWN, ALL, IMG],
        f"reconciliation/reconciliationcase/{case.pk}": [ALL, IMG, TEMPLATE, *ALL_AS_JSON],
        f"accounts/auditentry/{payloads.audit.pk}": [SCRIPT, as_json(f"{MASKED_SHOWN} {ALL}")],
    }
    for path, texts in admin_pages.items():
        page.goto(f"{live_server_url}/admin/{path}/change/")
        _shows(page, texts, "#content")
        _assert_inert(page, watch, f"admin {path}")
    # The case's observations, inline: the operator's evidence note as text.
    page.goto(f"{live_server_url}/admin/reconciliation/reconciliationcase/{case.pk}/change/")
    _shows(page, [ALL, SCRIPT, HTMX], ADMIN_LOOKUPS)
    page.screenshot(path=str(SCREENSHOTS / "xss-admin-audit-entry.png"), full_page=True)
    for listing, texts in {
        "agentruns/run": [f"{IMG} {TEXTAREA}"],
        "agentruns/step": [f"0001.model.{SVG}", f"ek_{SVG}"],
        "approvals/approval": [IMG],
        "reconciliation/reconciliationcase": [SVG],
        "accounts/auditentry": [SCRIPT, IMG],
    }.items():
        page.goto(f"{live_server_url}/admin/{listing}/")
        _shows(page, texts, "#result_list")
        _assert_inert(page, watch, f"admin {listing} list")
    context.close()


# --- by push over the live sockets ---------------------------------------------------


def test_payloads_pushed_over_the_live_sockets_stay_text(
    page, live_server_url, tenant, make_operator, payloads
):
    make_operator(tenant, *ROLES, username="ada")
    _log_in(page, live_server_url, "ada", "/runs/")
    run_page, inbox = page.context.new_page(), page.context.new_page()
    run_list = page
    watches = {"run list": _watch(run_list), "run page": _watch(run_page), "inbox": _watch(inbox)}
    run_page.goto(f"{live_server_url}/runs/{payloads.run.id}/")
    inbox.goto(f"{live_server_url}/approvals/")
    for live_page in (run_list, run_page):
        expect(live_page.locator("#live")).to_have_class("live on")
    badge = inbox.locator("#attention a[href='/approvals/'] .badge")
    expect(badge).to_have_text("1")
    expect(inbox.locator(".resource-now .problem")).to_be_visible()

    # From outside the pages: a client starts a run; a worker records a model step
    # and a failed tool call on the open run; another run asks for an approval.
    pushed = _run(
        tenant,
        agent_name=SVG,
        request_id=f"pushed {SCRIPT} {HTMX}",
        requested_by=IMG,
        outcome_code=JS_URL,
        current_step=f"{TEXTAREA} {JSON_BREAK}",
        input={"question": ALL},
    )
    _event(pushed, kind="created")
    _step(
        payloads.run,
        5,
        StepKind.MODEL,
        f"pushed {SVG}",
        StepStatus.SUCCEEDED,
        input={"messages": [{"role": "user", "content": ALL}]},
        result={"text": ALL},
        model_id=IMG,
        prompt_version=TEMPLATE,
    )
    _step(
        payloads.run,
        6,
        StepKind.TOOL,
        "pushed_lookup",
        StepStatus.FAILED,
        input={"order_id": JSON_BREAK, "reason": ALL},
        last_error_class=SCRIPT,
        last_error=f"{MASKED} {ALL}",
    )
    _event(payloads.run, "0006.tool.pushed_lookup")
    waiting = _run(tenant, request_id=f"waiting {IMG}", status=RunStatus.WAITING_FOR_APPROVAL)
    Approval.objects.create(
        tenant=tenant,
        run=waiting,
        step_id=f"0001.tool.{SVG}",
        tool=IMG,
        args={"reason": ALL},
        args_hash="b" * 64,
        effect_key=f"ek_pushed_{uuid.uuid4().hex[:8]}",
        resource=HTMX,
        resource_fingerprint="f" * 64,
        preview=ALL,
        expires_at=timezone.now() + timedelta(hours=1),
    )
    _event(waiting, kind="waiting_for_approval")

    row = run_list.locator(f"#run-{pushed.id}")
    expect(row).to_be_visible(timeout=15_000)
    _shows(run_list, [f"pushed {SCRIPT} {HTMX}", f"{SVG}@", f"{TEXTAREA} {JSON_BREAK}"], row)
    assert row.locator("a.outcome").get_attribute("href") == "?outcome=javascript%3Aalert%284%29"

    timeline = run_page.locator("#timeline")
    expect(timeline).to_contain_text(f"0005.model.pushed {SVG}", timeout=15_000)
    _shows(run_page, [f"{IMG} · prompt {TEMPLATE}", *ALL_AS_JSON], "#timeline li:has-text('0005')")
    _shows(
        run_page,
        [f"{SCRIPT}: {MASKED_SHOWN} {ALL}", *ALL_AS_JSON],
        "#timeline li:has-text('0006.tool.pushed_lookup')",
    )
    # The navigation's counts come by push on every page: the inbox's socket carries
    # no card, only that one more approval waits.
    expect(badge).to_have_text("2", timeout=15_000)

    for name, live_page in (("run list", run_list), ("run page", run_page), ("inbox", inbox)):
        _assert_inert(live_page, watches[name], f"{name}, after the push")
    # Reloaded, the pushed approval's card is a first load like any other.
    inbox.reload()
    _shows(inbox, [ALL, HTMX, IMG], "#approval-cards")
    _assert_inert(inbox, watches["inbox"], "inbox, reloaded after the push")
