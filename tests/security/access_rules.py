"""Who gets what: the access rules of every URL and websocket route, as a table.

One row per URL (by name, or by route when it has none), one column per caller.
``tests/security/test_access_matrix.py`` walks the URL conf and the websocket
routing, fails for a URL or route with no rule here (and for a rule whose URL is
gone), and checks every cell on SQLite and on PostgreSQL.

The callers, in column order:

- ``anonymous``: no session;
- ``other-tenant``: an operator of another tenant holding every role, so a 404 on
  this tenant's objects is the tenant scope at work, not a missing permission;
- ``staff``: a superuser of the admin who is no operator of any tenant;
- ``no-role``: an operator of the tenant in no group;
- the five roles of ``accounts/migrations/0004_create_operator_groups``, each an
  operator of the tenant: ``viewer``, ``operator``, ``approver``, ``reconciler``,
  ``admin``.

A cell is an HTTP status, or ``LOGIN`` / ``ADMIN_LOGIN``: a 302 to that login page
with the address asked for as ``next``. The objects named in the URLs (a run, an
approval, a case) belong to the tenant.

The sandbox (``/_sandbox/``, ``/v1/``, ``/shop/``) is not in this URL conf: it is a
server of its own (``sandbox/server.py``), whose control token and API keys
``tests/sandbox/test_control_access.py`` and ``tests/sandbox/test_accounts.py`` test.
"""

from __future__ import annotations

from dataclasses import dataclass

ANONYMOUS = "anonymous"
OTHER_TENANT = "other-tenant"
STAFF = "staff"
NO_ROLE = "no-role"
ROLES = ("viewer", "operator", "approver", "reconciler", "admin")
CALLERS = (ANONYMOUS, OTHER_TENANT, STAFF, NO_ROLE, *ROLES)
# Every permission of the dashboard, of this tenant: the caller of the CSRF checks.
ALL_PERMISSIONS = "admin"

LOGIN = "login"
ADMIN_LOGIN = "admin-login"

Cell = int | str  # a bool too, for a socket: accepted


def row(*cells: Cell) -> dict[str, Cell]:
    assert len(cells) == len(CALLERS), f"a row has one cell per caller: {CALLERS}"
    return dict(zip(CALLERS, cells, strict=True))


def everyone(cell: Cell) -> dict[str, Cell]:
    return row(*[cell] * len(CALLERS))


@dataclass(frozen=True)
class Variant:
    """The same address asked differently: as htmx asks for a fragment, for a part of
    the page, or searching for the tenant's run (``{run_id}`` is filled in)."""

    label: str
    query: str = ""
    htmx: bool = False


PAGE = Variant("")
FRAGMENT = Variant("htmx", htmx=True)
# What another tenant's operator must not find by asking for it by name.
SEARCH = Variant("search", "q={run_id}")


@dataclass(frozen=True)
class Rule:
    get: dict[str, Cell]
    # None: the view does not take POST, and answers it with 405.
    post: dict[str, Cell] | None = None
    # Why a POST needs no CSRF token here; empty: it needs one (403 without).
    csrf_exempt: str = ""
    # Every answer is JSON, errors included.
    json: bool = False
    variants: tuple[Variant, ...] = (PAGE,)


# The columns of every row below:
#          anonymous other staff no-role viewer operator approver reconciler admin

# A page of the tenant's runs, approvals or cases (view_runs). Another tenant's
# operator gets the page of their own tenant, which holds none of these.
LIST = row(LOGIN, 200, 403, 403, 200, 200, 200, 200, 200)
# One object of the tenant (view_runs): to another tenant's operator it does not exist.
OBJECT = row(LOGIN, 404, 403, 403, 200, 200, 200, 200, 200)
# A POST-only view answers GET with 405 before it asks who is calling.
POST_ONLY = everyone(405)
# A run's action (cancel_runs, retry_runs): the operator and admin roles.
RUN_ACTION = row(LOGIN, 404, 403, 403, 403, 302, 403, 403, 302)
# A case's action (settle_effects), with a form this deployment refuses: a 400 says the
# view got past access. (Lookups too: the test agent's tool is not deployed here.)
CASE_ACTION = row(LOGIN, 404, 403, 403, 403, 403, 403, 400, 400)

# The webhooks pages (webhooks.manage_webhooks: the admin role).
MANAGE_LIST = row(LOGIN, 200, 403, 403, 403, 403, 403, 403, 200)
MANAGE_OBJECT = row(LOGIN, 404, 403, 403, 403, 403, 403, 403, 200)

API_CSRF = (
    "bearer tokens, never cookies: the API ignores a session (401 without a token), "
    "so a forged cross-site request carries no credential"
)

# An address under /api/ that names nothing: a JSON 404 for every method and caller.
API_NOWHERE = Rule(get=everyone(404), post=everyone(404), csrf_exempt=API_CSRF, json=True)

RULES: dict[str, Rule] = {
    # --- the site's own pages
    "/": Rule(get=everyone(302), post=everyone(302)),  # to the runs list
    "login": Rule(get=everyone(200), post=everyone(200)),  # an empty form is shown again
    "logout": Rule(get=everyone(405), post=everyone(302)),  # to the login page
    "audit-list": Rule(  # view_audit
        get=row(LOGIN, 200, 403, 403, 403, 403, 403, 403, 200),
        variants=(PAGE, Variant("by-object", "object={run_id}")),
    ),
    # An operator's own preferences, whatever their role; an empty form is a 400, "choose a
    # time zone". Nobody else's can be named (another tenant's operator reaches their own).
    "preferences": Rule(
        get=row(LOGIN, 200, 403, 200, 200, 200, 200, 200, 200),
        post=row(LOGIN, 400, 403, 400, 400, 400, 400, 400, 400),
    ),
    # --- for load balancers and Prometheus: no session needed, and none honoured
    "healthz": Rule(get=everyone(200)),
    "readyz": Rule(get=everyone(503)),  # no sweeper holds its lease in tests
    "metrics": Rule(get=everyone(401)),  # the tests set HOLDFAST_METRICS_TOKEN
    # --- the runs API: a session is no credential (API_TOKEN_RULES: with a token)
    # The two addresses from before v1 (api/legacy.py), served as v1 serves them.
    "api-legacy:api-start-run": Rule(
        get=everyone(405), post=everyone(401), csrf_exempt=API_CSRF, json=True
    ),
    "api-legacy:api-get-run": Rule(get=everyone(401), csrf_exempt=API_CSRF, json=True),
    "api-legacy:api-root": API_NOWHERE,
    "api-not-found": API_NOWHERE,
    # --- the API, v1 (api/v1.py): API_TOKEN_RULES below with each caller's token
    "api-v1:api-root": API_NOWHERE,
    "api-v1:runs": Rule(get=everyone(401), post=everyone(401), csrf_exempt=API_CSRF, json=True),
    "api-v1:run": Rule(get=everyone(401), csrf_exempt=API_CSRF, json=True),
    "api-v1:run-cancel": Rule(
        get=everyone(405), post=everyone(401), csrf_exempt=API_CSRF, json=True
    ),
    "api-v1:run-retry": Rule(
        get=everyone(405), post=everyone(401), csrf_exempt=API_CSRF, json=True
    ),
    "api-v1:audit": Rule(get=everyone(401), csrf_exempt=API_CSRF, json=True),
    "api-v1:approvals": Rule(get=everyone(401), csrf_exempt=API_CSRF, json=True),
    "api-v1:approval": Rule(get=everyone(401), csrf_exempt=API_CSRF, json=True),
    "api-v1:cases": Rule(get=everyone(401), csrf_exempt=API_CSRF, json=True),
    "api-v1:case": Rule(get=everyone(401), csrf_exempt=API_CSRF, json=True),
    # The actions take POST only: GET is a JSON 405 before any token is asked for.
    "api-v1:approval-decision": Rule(
        get=everyone(405), post=everyone(401), csrf_exempt=API_CSRF, json=True
    ),
    "api-v1:case-lookup": Rule(
        get=everyone(405), post=everyone(401), csrf_exempt=API_CSRF, json=True
    ),
    "api-v1:case-observations": Rule(
        get=everyone(405), post=everyone(401), csrf_exempt=API_CSRF, json=True
    ),
    "api-v1:case-resolution": Rule(
        get=everyone(405), post=everyone(401), csrf_exempt=API_CSRF, json=True
    ),
    # Its documentation and OpenAPI document: for the tenant's operators, any role
    # (api/docs.py says why); read-only, so POST is 405 before access is asked.
    "api-v1:openapi-view": Rule(get=row(LOGIN, 200, 403, 200, 200, 200, 200, 200, 200)),
    "api-v1:openapi-json": Rule(get=row(LOGIN, 200, 403, 200, 200, 200, 200, 200, 200)),
    # --- runs
    "run-list": Rule(get=LIST, variants=(PAGE, FRAGMENT, SEARCH)),
    # The overview's charts (view_runs), and the fragment its page re-reads every 30 s.
    "overview": Rule(get=LIST, variants=(PAGE, FRAGMENT)),
    "run-detail": Rule(
        get=OBJECT, variants=(PAGE, FRAGMENT, Variant("holder", "part=holder", True))
    ),
    "run-cancel": Rule(get=POST_ONLY, post=RUN_ACTION),
    "run-retry": Rule(get=POST_ONLY, post=RUN_ACTION),
    # A run's evidence, as a printable page and a download (view_runs); each is audited.
    # Bulk actions: an empty form chooses no action (400), past login and permission.
    "bulk-confirm": Rule(get=POST_ONLY, post=row(LOGIN, 400, 403, 403, 400, 400, 400, 400, 400)),
    "bulk-start": Rule(get=POST_ONLY, post=row(LOGIN, 400, 403, 403, 400, 400, 400, 400, 400)),
    "bulk-progress": Rule(get=OBJECT),
    "run-evidence": Rule(get=OBJECT),
    "run-evidence-json": Rule(get=OBJECT),
    # --- approvals: pending, requested by someone else
    "approval-inbox": Rule(get=LIST),
    "approval-detail": Rule(get=OBJECT),
    "approval-resource": Rule(get=OBJECT, variants=(PAGE, FRAGMENT)),
    # decide_approvals, with an empty form: 400, "Choose Approve or Reject."
    "approval-decide": Rule(get=POST_ONLY, post=row(LOGIN, 404, 403, 403, 403, 403, 400, 403, 400)),
    # retry_runs: 409, only an expired approval is requested again.
    "approval-rerequest": Rule(
        get=POST_ONLY, post=row(LOGIN, 404, 403, 403, 403, 409, 403, 403, 409)
    ),
    # decide_approvals: done, back to the inbox.
    "approval-ask-again": Rule(
        get=POST_ONLY, post=row(LOGIN, 404, 403, 403, 403, 403, 302, 403, 302)
    ),
    # --- reconciliation
    "case-queue": Rule(get=LIST, variants=(PAGE, FRAGMENT)),
    "case-detail": Rule(get=OBJECT),
    "case-lookup": Rule(get=POST_ONLY, post=CASE_ACTION),
    "case-record": Rule(get=POST_ONLY, post=CASE_ACTION),
    "case-resolve": Rule(get=POST_ONLY, post=CASE_ACTION),
    # --- webhooks: the tenant's endpoints (webhooks.manage_webhooks, the admin role); another
    # tenant's admin reaches their own list and none of this tenant's endpoints
    "webhook-list": Rule(get=MANAGE_LIST),
    # An empty form is a 400 (an address and an event type are needed), past the checks.
    "webhook-create": Rule(get=MANAGE_LIST, post=row(LOGIN, 400, 403, 403, *[403] * 4, 400)),
    "webhook-detail": Rule(get=MANAGE_OBJECT),
    "webhook-edit": Rule(get=MANAGE_OBJECT, post=row(LOGIN, 404, 403, 403, *[403] * 4, 400)),
    # The new secret's page, shown once.
    "webhook-rotate": Rule(get=POST_ONLY, post=MANAGE_OBJECT),
    "webhook-disable": Rule(get=POST_ONLY, post=row(LOGIN, 404, 403, 403, *[403] * 4, 302)),
    "webhook-enable": Rule(get=POST_ONLY, post=row(LOGIN, 404, 403, 403, *[403] * 4, 302)),
    # --- the admin's login, the one admin page for everyone (staff is sent on to the index)
    "admin:login": Rule(get=row(200, 200, 302, 200, 200, 200, 200, 200, 200), post=everyone(200)),
}

# Every other URL of a namespace: the admin's generated URLs are for staff only.
GROUP_RULES: dict[str, Rule] = {
    "admin": Rule(get=row(ADMIN_LOGIN, ADMIN_LOGIN, 200, ADMIN_LOGIN, *[ADMIN_LOGIN] * len(ROLES))),
}

# The runs API with a bearer token issued to the caller (anonymous: none). A token acts
# as its owner, so it answers as the owner's role does; an empty body is a 400.
API_TOKEN_RULES: dict[tuple[str, str], dict[str, Cell]] = {
    ("POST", "api-legacy:api-start-run"): row(401, 400, 403, 403, 403, 400, 403, 403, 400),
    ("GET", "api-legacy:api-get-run"): row(401, 404, 403, 403, 200, 200, 200, 200, 200),
    # runs:start (start_runs), runs:read (view_runs), audit:read (view_audit)
    ("POST", "api-v1:runs"): row(401, 400, 403, 403, 403, 400, 403, 403, 400),
    ("GET", "api-v1:runs"): row(401, 200, 403, 403, 200, 200, 200, 200, 200),
    ("GET", "api-v1:run"): row(401, 404, 403, 403, 200, 200, 200, 200, 200),
    # runs:cancel (cancel_runs), runs:retry (retry_runs): done (the engine's side stood in for)
    ("POST", "api-v1:run-cancel"): row(401, 404, 403, 403, 403, 200, 403, 403, 200),
    ("POST", "api-v1:run-retry"): row(401, 404, 403, 403, 403, 200, 403, 403, 200),
    ("GET", "api-v1:audit"): row(401, 200, 403, 403, 403, 403, 403, 403, 200),
    # approvals:read and cases:read (view_runs): another tenant's operator lists their
    # own tenant's (none of these) and finds none of this tenant's.
    ("GET", "api-v1:approvals"): row(401, 200, 403, 403, 200, 200, 200, 200, 200),
    ("GET", "api-v1:approval"): row(401, 404, 403, 403, 200, 200, 200, 200, 200),
    ("GET", "api-v1:cases"): row(401, 200, 403, 403, 200, 200, 200, 200, 200),
    ("GET", "api-v1:case"): row(401, 404, 403, 403, 200, 200, 200, 200, 200),
    # approvals:decide (decide_approvals: approver, admin) and cases:settle
    # (settle_effects: reconciler, admin); an empty body is a 400, past access.
    ("POST", "api-v1:approval-decision"): row(401, 400, 403, 403, 403, 403, 400, 403, 400),
    ("POST", "api-v1:case-lookup"): row(401, 400, 403, 403, 403, 403, 403, 400, 400),
    ("POST", "api-v1:case-observations"): row(401, 400, 403, 403, 403, 403, 403, 400, 400),
    ("POST", "api-v1:case-resolution"): row(401, 400, 403, 403, 403, 403, 403, 400, 400),
}

# A websocket route: True where the socket is accepted, else the code it is closed with:
# 4401 no login, 4403 no operator who may see runs, 4404 no such object in the caller's
# tenant (or no such page). A route naming a live page (agentruns.live) has a rule for
# each page config/wiring.py installs, the page's name in place of PAGE_SLUG.
PAGE_SLUG = "<slug:page>"
# A page of the tenant's runs, approvals or cases; another tenant's gets its own.
SOCKET_LIST = row(4401, True, 4403, 4403, True, True, True, True, True)
# One object of the tenant.
SOCKET_OBJECT = row(4401, 4404, 4403, 4403, True, True, True, True, True)
# A live page nobody installed, or an object page asked for no object.
NO_PAGE = row(4401, 4404, 4403, 4403, 4404, 4404, 4404, 4404, 4404)
SOCKET_RULES: dict[str, dict[str, Cell]] = {
    "ws/runs/": SOCKET_LIST,
    "ws/runs/<uuid:run_id>/": SOCKET_OBJECT,
    "ws/nav/": SOCKET_LIST,
    # The live pages: a list reads no object id; an object page without one shows nothing.
    # The audit log: view_audit (the admin role; another tenant's admin reads their own).
    "ws/live/audit/": row(4401, True, 4403, 4403, 4404, 4404, 4404, 4404, True),
    "ws/live/audit/<int:object_id>/": row(4401, True, 4403, 4403, 4404, 4404, 4404, 4404, True),
    "ws/live/inbox/": SOCKET_LIST,
    "ws/live/inbox/<int:object_id>/": SOCKET_LIST,
    "ws/live/approval/": NO_PAGE,
    "ws/live/approval/<int:object_id>/": SOCKET_OBJECT,
    "ws/live/cases/": SOCKET_LIST,
    "ws/live/cases/<int:object_id>/": SOCKET_LIST,
    "ws/live/case/": NO_PAGE,
    "ws/live/case/<int:object_id>/": SOCKET_OBJECT,
    # An endpoint's delivery log: webhooks.manage_webhooks (the admin role), as its page.
    "ws/live/webhook/": NO_PAGE,
    "ws/live/webhook/<int:object_id>/": row(4401, 4404, 4403, 4403, *[4404] * 4, True),
}
# What a live page's <int:object_id> names: an object of the tenant (World.value).
LIVE_PAGE_OBJECTS = {
    "audit": "case_id",  # a list: any number
    "inbox": "approval_id",
    "approval": "approval_id",
    "cases": "case_id",
    "case": "case_id",
    "webhook": "endpoint_id",
}
