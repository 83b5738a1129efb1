"""Every URL and websocket route, every kind of caller → the status its rule names.

The addresses come from the URL conf and the ASGI application's websocket routing,
walked when the tests are collected; the rules from ``tests/security/access_rules.py``.
A URL or route with no rule fails the suite, and so does a rule whose URL is gone.
Every POST a view takes is refused without a CSRF token; the runs API, which takes
bearer tokens and ignores sessions, is the one exception.

The tenant's objects and every caller's session are made once for the module, in a
transaction rolled back at its end; each test runs in a savepoint of its own
(pytest-django's ``db``), so a POST that cancels the run is gone for the next test.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from http.cookies import SimpleCookie

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import transaction
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from django.utils import timezone
from django.utils.crypto import get_random_string

from accounts.models import ApiToken, AuditEntry, Operator, Tenant
from accounts.services import audit_record
from agentruns import consumers
from agentruns.models import Run, Step, StepKind, StepStatus
from approvals.models import Approval
from bulk.models import BulkAction
from config.asgi import application
from reconciliation.models import ReconciliationCase
from tests.harness import Harness, refused_with
from tests.security.access_rules import (
    ADMIN_LOGIN,
    ALL_PERMISSIONS,
    ANONYMOUS,
    API_TOKEN_RULES,
    CALLERS,
    GROUP_RULES,
    LIVE_PAGE_OBJECTS,
    LOGIN,
    NO_PAGE,
    OTHER_TENANT,
    PAGE,
    PAGE_SLUG,
    ROLES,
    RULES,
    SOCKET_RULES,
    STAFF,
    Cell,
    Rule,
    Variant,
)
from webhooks.models import WebhookEndpoint
from webhooks.signing import secret_new

ORIGIN = (b"origin", b"http://127.0.0.1")
METRICS_TOKEN = "matrix-metrics-token"


# --- what there is to reach -------------------------------------------------------------


@dataclass(frozen=True)
class Address:
    key: str  # the URL's name (namespaced), or its route when it has none
    route: str
    namespace: str
    kwargs: tuple[str, ...]
    csrf_exempt: bool  # what CsrfViewMiddleware reads from the view


def _addresses(patterns, prefix: str = "", namespace: str = "") -> Iterator[Address]:
    for pattern in patterns:
        route = prefix + str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            inner = f"{namespace}{pattern.namespace}:" if pattern.namespace else namespace
            yield from _addresses(pattern.url_patterns, route, inner)
        elif isinstance(pattern, URLPattern):
            key = f"{namespace}{pattern.name}" if pattern.name else "/" + route
            kwargs = tuple(pattern.pattern.regex.groupindex)
            exempt = getattr(pattern.callback, "csrf_exempt", False)
            yield Address(key, route, namespace.rstrip(":"), kwargs, exempt)


ADDRESSES = list(_addresses(get_resolver().url_patterns))


def _rule(address: Address) -> Rule | None:
    return RULES.get(address.key) or GROUP_RULES.get(address.namespace)


def _socket_routes() -> list[str]:
    """The websocket routes the ASGI application serves, through its middleware."""
    app = application.application_mapping["websocket"]
    while not hasattr(app, "routes"):
        app = getattr(app, "inner", None) or app.application
    return _routes(app.routes)


def _routes(patterns, prefix: str = "") -> list[str]:
    found = []
    for pattern in patterns:
        route = prefix + str(pattern.pattern)
        inner = getattr(pattern.callback, "routes", None)
        found.extend(_routes(inner, route) if inner is not None else [route])
    return found


@dataclass(frozen=True)
class Socket:
    key: str  # the route, with a live page's name filled in
    page: str | None = None


def _sockets(routes: list[str]) -> Iterator[Socket]:
    """Every route; a route that names a live page, once for each page installed."""
    for route in routes:
        if PAGE_SLUG not in route:
            yield Socket(route)
            continue
        from config.wiring import LIVE_PAGES

        for name in sorted(LIVE_PAGES):
            yield Socket(route.replace(PAGE_SLUG, name), name)


NO_SUCH_PAGE = "no-such-page"
SOCKET_ROUTES = _socket_routes()
SOCKETS = list(_sockets(SOCKET_ROUTES))
# A live page's route asked for a page nobody installed.
NO_SUCH_PAGES = [
    Socket(route.replace(PAGE_SLUG, NO_SUCH_PAGE), NO_SUCH_PAGE)
    for route in SOCKET_ROUTES
    if PAGE_SLUG in route
]


# --- the tenant's objects and the callers, once for the module ---------------------------


@dataclass
class World:
    run: Run
    approval: Approval
    case: ReconciliationCase
    bulk: BulkAction
    endpoint: WebhookEndpoint
    sessions: dict[str, str]  # caller -> session key
    tokens: dict[str, str]  # caller -> bearer token
    # Made once: each new Client loads the middleware again, WhiteNoise's scan of
    # the static files included.
    clients: dict[bool, Client] = field(
        default_factory=lambda: {False: Client(), True: Client(enforce_csrf_checks=True)}
    )

    @property
    def run_page(self) -> str:
        """The run's address: every page and fragment that shows the run links to it."""
        return reverse("run-detail", kwargs={"run_id": self.run.id})

    def value(self, kwarg: str, page: str | None = None) -> str:
        values = {
            "run_id": self.run.id,
            "approval_id": self.approval.pk,
            "case_id": self.case.pk,
            "action_id": self.bulk.pk,
            "endpoint_id": self.endpoint.pk,
            "path": "nothing-here",
            "app_label": "agentruns",
        }
        if kwarg == "object_id" and page is not None:
            # The number an unknown page is asked for names nothing: any will do.
            kwarg = "approval_id" if page == NO_SUCH_PAGE else LIVE_PAGE_OBJECTS.get(page, "")
            assert kwarg, f"which object does live page {page!r} show? add it to LIVE_PAGE_OBJECTS"
        assert kwarg in values, f"no object for URL argument {kwarg!r}: add one to World.value"
        return str(values[kwarg])

    def client(self, caller: str, *, enforce_csrf_checks: bool = False) -> Client:
        """The caller's client, with the caller's session cookie and nothing else."""
        client = self.clients[enforce_csrf_checks]
        client.cookies = SimpleCookie()
        if caller in self.sessions:
            client.cookies[settings.SESSION_COOKIE_NAME] = self.sessions[caller]
        return client


def _group(name: str) -> Group:
    # Transactional tests elsewhere flush the groups the data migrations made;
    # the conftest's make_operator restores them the same way.
    from tests.conftest import _grant_group_permissions

    group, _ = Group.objects.get_or_create(name=name)
    if not group.permissions.exists():
        _grant_group_permissions(group)
    return group


def _caller(caller: str, tenant: Tenant, other: Tenant):
    users = get_user_model().objects
    username = f"matrix-{caller}"
    if caller == STAFF:
        return users.create_superuser(username=username, password="correct horse battery")
    user = users.create_user(username=username, password="correct horse battery")
    Operator.objects.create(user=user, tenant=other if caller == OTHER_TENANT else tenant)
    if caller == OTHER_TENANT:
        user.groups.add(_group("admin"))
    elif caller in ROLES:
        user.groups.add(_group(caller))
    return user


def _token(user) -> str:
    if user.is_staff:
        # No operator now, so none could be issued to it: it was an operator once.
        Operator.objects.create(user=user, tenant=Tenant.objects.get(slug="default"))
        secret = ApiToken.issue(owner=user, name="matrix")[1]
        Operator.objects.filter(user=user).delete()
        user.refresh_from_db()
        return secret
    return ApiToken.issue(owner=user, name="matrix")[1]


def _objects(
    tenant: Tenant,
) -> tuple[Run, Approval, ReconciliationCase, BulkAction, WebhookEndpoint]:
    # Queued, never advanced: the engine refuses to run inside a transaction (on
    # SQLite), and this module's objects live in one.
    run = Harness(tenant).start("flow", {"sleep": 600})
    step = Step.objects.create(
        run=run,
        seq=0,
        step_id="0000.tool.charge",
        kind=StepKind.TOOL,
        name="charge",
        status=StepStatus.UNKNOWN,
        is_effect=True,
        effect_key="matrix-effect",
        attempts=1,
    )
    approval = Approval.objects.create(
        tenant=tenant,
        run=run,
        step_id=step.step_id,
        tool="charge",
        args={"order_id": "o-1", "amount": 6000},
        args_hash="a" * 64,
        effect_key="matrix-effect",
        requested_by="user:requester",
        resource="order:o-1",
        resource_fingerprint="f" * 64,
        preview="Charge 60.00 EUR",
        amount=6000,
        currency="eur",
        expires_at=timezone.now() + timedelta(hours=1),
    )
    case = ReconciliationCase.objects.create(
        tenant=tenant,
        run=run,
        step=step,
        step_id_label=step.step_id,
        tool="charge",
        effect_key="matrix-effect",
    )
    # Something the audit page can show of the run (to the tenant alone).
    audit_record(
        tenant=tenant,
        actor="user:requester",
        action="run.start",
        object_type="run",
        object_id=run.id,
    )
    bulk = BulkAction.objects.create(tenant=tenant, kind="cancel", actor="user:requester", total=1)
    endpoint = WebhookEndpoint.objects.create(
        tenant=tenant,
        url="https://hooks.example/holdfast",
        events=["run.ended"],
        secret=secret_new(),
        created_by="user:requester",
    )
    return run, approval, case, bulk, endpoint


@pytest.fixture(scope="module")
def world(django_db_setup, django_db_blocker) -> Iterator[World]:
    with django_db_blocker.unblock(), transaction.atomic():
        tenant = Tenant.objects.get_or_create(slug="default", defaults={"name": "Default"})[0]
        other = Tenant.objects.get_or_create(slug="other", defaults={"name": "Other"})[0]
        world = World(*_objects(tenant), sessions={}, tokens={})
        for caller in CALLERS[1:]:
            user = _caller(caller, tenant, other)
            login = world.client(ANONYMOUS)
            login.force_login(user)  # a session of its own: the client had no cookie
            world.sessions[caller] = login.cookies[settings.SESSION_COOKIE_NAME].value
            world.tokens[caller] = _token(user)
        yield world
        transaction.set_rollback(True)


@dataclass
class Actions:
    """The engine's side of the run actions, stood in for: this module is about who
    reaches them (``tests/agentruns/test_run_actions.py`` is about what they do)."""

    taken: list[str]


@pytest.fixture(autouse=True)
def actions(settings, monkeypatch) -> Actions:
    settings.HOLDFAST_METRICS_TOKEN = METRICS_TOKEN
    actions = Actions(taken=[])

    def cancel(run_id, *, by):
        actions.taken.append("cancel")
        return Run.objects.get(pk=run_id)

    def wake(run_id, *, by):
        actions.taken.append("retry")
        return True

    def resume(run_id, *, by, enqueue=None):
        actions.taken.append("resume")
        return True

    monkeypatch.setattr("agentruns.views.run_cancel", cancel)
    monkeypatch.setattr("agentruns.views.run_wake", wake)
    monkeypatch.setattr("api.runs.run_cancel", cancel)
    monkeypatch.setattr("api.runs.run_wake", wake)
    monkeypatch.setattr("approvals.services.run_resume", resume)
    return actions


def _path(address: Address, world: World, variant: Variant = PAGE) -> str:
    if address.key.startswith("/"):
        path = address.key
    else:
        path = reverse(address.key, kwargs={k: world.value(k) for k in address.kwargs})
    if not variant.query:
        return path
    return f"{path}?{variant.query.format(run_id=world.run.id)}"


def _check(response, cell: Cell, rule: Rule, what: str) -> None:
    location = response.get("Location", "")
    if cell in (LOGIN, ADMIN_LOGIN):
        login = reverse("login" if cell == LOGIN else "admin:login")
        assert response.status_code == 302 and location.startswith(f"{login}?next="), (
            f"{what}: expected a redirect to {login}, got {response.status_code} {location}"
        )
    else:
        assert response.status_code == cell, (
            f"{what}: expected {cell}, got {response.status_code} {location}"
        )
    if rule.json:
        assert response["Content-Type"] == "application/json", f"{what}: not JSON"


# --- the rules cover the URL conf, and only it -------------------------------------------


def test_every_url_has_a_rule():
    missing = [f"{a.key} ({a.route!r})" for a in ADDRESSES if _rule(a) is None]
    assert not missing, (
        "URLs with no access rule (add each to RULES in tests/security/access_rules.py): "
        + ", ".join(missing)
    )


def test_every_rule_names_a_url_that_exists():
    keys = {address.key for address in ADDRESSES}
    namespaces = {address.namespace for address in ADDRESSES}
    gone = sorted(set(RULES) - keys) + sorted(set(GROUP_RULES) - namespaces)
    gone += [key for _, key in API_TOKEN_RULES if key not in keys]
    assert not gone, f"rules for URLs that no longer exist: {', '.join(gone)}"


def test_every_websocket_route_has_a_rule_and_every_rule_a_route():
    keys = {socket.key for socket in SOCKETS}
    missing = sorted(keys - set(SOCKET_RULES))
    assert not missing, (
        "websocket routes with no access rule (add each to SOCKET_RULES in "
        f"tests/security/access_rules.py): {', '.join(missing)}"
    )
    gone = sorted(set(SOCKET_RULES) - keys)
    assert not gone, f"websocket rules for routes that no longer exist: {', '.join(gone)}"


def test_only_the_views_the_rules_name_skip_the_csrf_check():
    wrong = [
        f"{a.key} ({'exempt' if a.csrf_exempt else 'checked'})"
        for a in ADDRESSES
        if _rule(a) is not None and a.csrf_exempt != bool(_rule(a).csrf_exempt)
    ]
    assert not wrong, f"CSRF exemption differs from the rule: {', '.join(wrong)}"


def test_the_roles_are_the_groups_the_migration_makes():
    migration = importlib.import_module("accounts.migrations.0004_create_operator_groups")
    assert set(ROLES) == set(migration.GROUPS)


# --- HTTP: every URL, every caller ----------------------------------------------------

# The admin's generated URLs share one rule; these stand for them: the index, every
# app's page, every model's list and the password change (every other admin page sits
# behind the same staff check, AdminSite.admin_view).
ADMIN_SAMPLE = re.compile(r"admin:(index|app_list|\w+_changelist|password_change)$")


def _tested(address: Address) -> bool:
    return address.namespace != "admin" or bool(
        address.key in RULES or ADMIN_SAMPLE.match(address.key)
    )


def _get_cases():
    for address in ADDRESSES:
        rule = _rule(address)
        if rule is None or not _tested(address):
            continue
        for variant in rule.variants:
            label = f"{address.key}[{variant.label}]" if variant.label else address.key
            for caller in CALLERS:
                yield pytest.param(address, variant, caller, id=f"GET {label} as {caller}")


@pytest.mark.parametrize(("address", "variant", "caller"), list(_get_cases()))
def test_a_get_answers_each_caller_as_its_rule_says(db, world, address, variant, caller):
    rule = _rule(address)
    path = _path(address, world, variant)
    headers = {"HTTP_HX_REQUEST": "true"} if variant.htmx else {}
    response = world.client(caller).get(path, **headers)
    _check(response, rule.get[caller], rule, f"GET {path} as {caller}")
    if caller == OTHER_TENANT and response.status_code == 200:
        assert world.run_page not in response.content.decode(), (
            f"GET {path} shows the other tenant's run"
        )


def _post_cases():
    for address in ADDRESSES:
        rule = _rule(address)
        if rule is not None and rule.post is not None:
            for caller in CALLERS:
                yield pytest.param(address, caller, id=f"POST {address.key} as {caller}")


@pytest.mark.parametrize(("address", "caller"), list(_post_cases()))
def test_a_post_answers_each_caller_as_its_rule_says(db, world, actions, address, caller):
    rule = _rule(address)
    path = _path(address, world)
    audited = AuditEntry.objects.count()
    response = world.client(caller).post(path)
    cell = rule.post[caller]
    _check(response, cell, rule, f"POST {path} as {caller}")
    if cell in (LOGIN, 401, 403, 404):
        assert not actions.taken, f"POST {path} as {caller} reached {actions.taken}"
        assert AuditEntry.objects.count() == audited, f"POST {path} as {caller} was audited"


def _get_only_cases():
    for address in ADDRESSES:
        rule = _rule(address)
        if rule is not None and address.namespace != "admin" and rule.post is None:
            yield pytest.param(address, id=address.key)


@pytest.mark.parametrize("address", list(_get_only_cases()))
def test_a_url_whose_rule_has_no_post_answers_post_with_405(db, world, address):
    # So a view cannot start taking POST without a rule (and the CSRF check below).
    path = _path(address, world)
    response = world.client(ALL_PERMISSIONS).post(path)
    assert response.status_code == 405, f"POST {path} answered {response.status_code}"


def test_the_tenants_own_operators_find_what_the_other_tenant_does_not(db, world):
    # The other tenant's pages above must not link to the run; its own tenant's do.
    run_id = world.run.id
    found = world.client("viewer").get(f"{reverse('run-list')}?q={run_id}")
    assert world.run_page in found.content.decode()
    found = world.client("admin").get(f"{reverse('audit-list')}?object={run_id}")
    assert world.run_page in found.content.decode()


# --- the runs API with the callers' own bearer tokens ----------------------------------


def _token_cases():
    for method, key in API_TOKEN_RULES:
        for caller in CALLERS:
            yield pytest.param(method, key, caller, id=f"{method} {key} with {caller}'s token")


@pytest.mark.parametrize(("method", "key", "caller"), list(_token_cases()))
def test_the_api_answers_a_token_as_its_owners_role(db, world, method, key, caller):
    address = next(a for a in ADDRESSES if a.key == key)
    path = _path(address, world)
    token = world.tokens.get(caller)
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    # A client system: no session, no CSRF cookie.
    client = world.client(ANONYMOUS, enforce_csrf_checks=True)
    if method == "POST":
        response = client.post(path, b"{}", content_type="application/json", **headers)
    else:
        response = client.get(path, **headers)
    cell = API_TOKEN_RULES[method, key][caller]
    assert response.status_code == cell, f"{method} {path} with {caller}'s token"
    assert response["Content-Type"] == "application/json"


def _api_cases():
    for address in ADDRESSES:
        rule = _rule(address)
        if rule is not None and rule.json:
            for method in ("GET", "POST", "PUT", "DELETE"):
                yield pytest.param(address, method, id=f"{method} {address.key}")


@pytest.mark.parametrize(("address", "method"), list(_api_cases()))
def test_the_api_answers_a_client_system_in_json_whatever_the_method(db, world, address, method):
    client = world.client(ANONYMOUS, enforce_csrf_checks=True)
    path = _path(address, world)
    response = client.generic(method, path, b"{}", content_type="application/json")
    assert response["Content-Type"] == "application/json", (
        f"{method} {path}: {response.status_code}"
    )


# --- CSRF -------------------------------------------------------------------------------


def _csrf_cases():
    for address in ADDRESSES:
        rule = _rule(address)
        if rule is None or rule.post is None:
            continue
        yield pytest.param(address, ALL_PERMISSIONS, id=f"{address.key} as {ALL_PERMISSIONS}")
        if address.key in ("login", "admin:login"):
            # Login CSRF: the form is posted by someone not logged in yet.
            yield pytest.param(address, ANONYMOUS, id=f"{address.key} as {ANONYMOUS}")


@pytest.mark.parametrize(("address", "caller"), list(_csrf_cases()))
def test_a_post_without_a_csrf_token_is_refused(db, world, address, caller):
    rule = _rule(address)
    path = _path(address, world)
    strict = world.client(caller, enforce_csrf_checks=True)
    if rule.csrf_exempt:
        # The exception: a logged-in session is no credential there, so a forged
        # request carries none.
        response = strict.post(path, b"{}", content_type="application/json")
        _check(response, rule.post[caller], rule, f"POST {path} as {caller} without a token")
        return
    assert strict.post(path).status_code == 403, f"POST {path} without a CSRF token"
    # With the token the same POST gets what the matrix says: the token was the difference.
    secret = get_random_string(32)
    strict.cookies[settings.CSRF_COOKIE_NAME] = secret
    response = strict.post(path, HTTP_X_CSRFTOKEN=secret)
    _check(response, rule.post[caller], rule, f"POST {path} with a CSRF token")


def _admin_list_cases():
    for address in ADDRESSES:
        if address.namespace == "admin" and address.key.endswith("_changelist"):
            yield pytest.param(address, id=address.key)


@pytest.mark.parametrize("address", list(_admin_list_cases()))
def test_an_admin_post_without_a_csrf_token_is_refused(db, world, address):
    # A list page takes POST: its bulk actions.
    path = _path(address, world)
    strict = world.client(STAFF, enforce_csrf_checks=True)
    assert strict.post(path).status_code == 403, f"POST {path} without a CSRF token"


# --- websockets: every route, every caller --------------------------------------------


@pytest.fixture
def sockets_share_the_test_transaction(monkeypatch):
    # channels closes "old" connections around each database call; inside the test's
    # transaction that would close the connection holding this module's objects.
    # Its calls run on this thread (thread-sensitive), so they see them without it.
    monkeypatch.setattr("channels.db.close_old_connections", lambda: None)


def _socket_path(socket: Socket, world: World) -> str:
    fill = lambda m: world.value(m.group(1), socket.page)  # noqa: E731
    return "/" + re.sub(r"<(?:\w+:)?(\w+)>", fill, socket.key)


def _socket_cases():
    for socket in SOCKETS:
        for caller in CALLERS:
            yield pytest.param(
                socket, SOCKET_RULES.get(socket.key), caller, id=f"{socket.key} as {caller}"
            )
    for socket in NO_SUCH_PAGES:
        for caller in CALLERS:
            yield pytest.param(socket, NO_PAGE, caller, id=f"{socket.key} as {caller}")


@pytest.mark.usefixtures("sockets_share_the_test_transaction")
@pytest.mark.parametrize(("socket", "rule", "caller"), list(_socket_cases()))
def test_a_socket_answers_each_caller_as_its_rule_says(db, world, socket, rule, caller):
    assert rule is not None, f"no rule for websocket route {socket.key}"
    path = _socket_path(socket, world)
    headers = [ORIGIN]
    if caller in world.sessions:
        cookie = f"{settings.SESSION_COOKIE_NAME}={world.sessions[caller]}"
        headers.append((b"cookie", cookie.encode()))
    expected = rule[caller]

    async def scenario():
        communicator = WebsocketCommunicator(application, path, headers=headers)
        if expected is True:
            connected, code = await communicator.connect(timeout=20)
            assert connected, f"{path} as {caller}: closed with {code}"
            snapshot = await communicator.receive_from(timeout=20)
            assert 'id="live-notice"' not in snapshot, f"{path} as {caller}: {snapshot}"
            if caller == OTHER_TENANT:
                assert world.run_page not in snapshot, f"{path} pushed the other tenant's run"
            elif socket.key == "ws/runs/":
                assert world.run_page in snapshot, f"{path} left out the tenant's own run"
        else:
            # Refused with a reason the page shows, then closed with the rule's code.
            code, _ = await refused_with(communicator)
            assert code == expected, f"{path} as {caller}"
        # As the server does after a close: the consumer gives back its place.
        await communicator.disconnect()

    async_to_sync(scenario)()
    assert not consumers._open_sockets, f"{path} as {caller} still counts an open socket"


@pytest.mark.usefixtures("sockets_share_the_test_transaction")
@pytest.mark.parametrize("socket", SOCKETS, ids=lambda socket: socket.key)
def test_a_socket_opened_from_another_origin_is_refused(db, world, socket):
    cookie = f"{settings.SESSION_COOKIE_NAME}={world.sessions[ALL_PERMISSIONS]}"
    headers = [(b"origin", b"https://elsewhere.example"), (b"cookie", cookie.encode())]
    path = _socket_path(socket, world)

    async def scenario():
        communicator = WebsocketCommunicator(application, path, headers=headers)
        connected, _ = await communicator.connect(timeout=5)
        assert not connected, f"{path} accepted a socket from another origin"
        await communicator.disconnect()

    async_to_sync(scenario)()
