"""Live pages: a websocket per page pushes htmx out-of-band fragments when runs change.

Workers are other processes, so the web process learns of changes from the
RunEvent and AuditEntry logs, never from memory. The process's one follower
(``agentruns.follower``) reads each watched tenant's logs (when PostgreSQL notifies
it, or at an interval) and hands every socket of that tenant the same batch; a
socket reads nothing itself unless it has something to push. Events are hints
(DESIGN §12.7): a fragment is always re-rendered from the run's current row, and
every (re)connect starts with a full snapshot. Sockets that would render the same
fragments (one login's identical pages) share one render of a batch, and sockets
of one session share one access check.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from datetime import UTC
from urllib.parse import parse_qs

from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.contrib.auth import SESSION_KEY, get_user_model
from django.contrib.auth.context_processors import PermWrapper
from django.contrib.sessions.backends.base import SessionBase
from django.db.utils import InterfaceError, OperationalError
from django.http import HttpRequest, QueryDict
from django.template.loader import render_to_string
from django.utils import timezone
from django.utils.module_loading import import_string

from accounts.middleware import zone_of
from accounts.models import Operator
from accounts.navigation import attention_for
from agentruns.follower import PAGES_OUTAGE, Moved, follower, live_sync_to_async
from agentruns.live import Fresh, Watcher, live_page
from agentruns.models import Run
from agentruns.selectors import (
    run_detail_context,
    run_list_context,
    run_matches,
    run_tabs_context,
)

# A socket checks again this often (and before every push) that whoever opened it may
# still watch: the session, the login, the permission and the tenant. The periods
# are on one clock for the process, so the sockets of one session share each check.
RECHECK_SECONDS = 3.0


def tenant_group(tenant_id: int) -> str:
    return f"runs-tenant-{tenant_id}"


# Open sockets per login, in this process: a page opens one, a person a handful.
_open_sockets: Counter[int] = Counter()


class RunsConsumer(AsyncWebsocketConsumer):
    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self._refuse(4401, "you are signed out", sign_in=True)
            return
        self.operator = await live_sync_to_async(self._operator)(user)
        if self.operator is None:
            await self._refuse(4403, "you may not see runs")
            return
        limit = settings.HOLDFAST_MAX_SOCKETS_PER_USER
        if _open_sockets[user.pk] >= limit:
            await self._refuse(
                4429, f"your login has {limit} live pages open already; close some and reload"
            )
            return
        _open_sockets[user.pk] += 1
        self.counted_user = user.pk
        self.session_key = getattr(self.scope.get("session"), "session_key", None)
        route = self.scope["url_route"]["kwargs"]
        self.run_id = route.get("run_id")
        self.navigation_only = bool(route.get("navigation_only"))
        self.params = parse_qs(self.scope.get("query_string", b"").decode())
        self.page = None
        if route.get("page") is not None:
            factory = live_page(route["page"])
            if factory is None:
                await self._refuse(4404, "there is no such live page")
                return
            self.page = await live_sync_to_async(self._open_page)(factory, route)
        if not await live_sync_to_async(self._visible)():
            await self._refuse(4404, "there is no such live page")
            return
        self.tenant_id = self.operator.tenant_id
        self.moved: list[Moved] = []
        self.has_moved = asyncio.Event()
        # When the periodic access check fell due (None: not due); see _recheck_due.
        self.recheck_at: float | None = None
        self.recheck = None
        # What a render of this socket's batches is shared by (with _render's batches).
        self.render_key = (
            self.operator.user_id,
            self.run_id,
            self.navigation_only,
            tuple(sorted((name, tuple(values)) for name, values in self.params.items())),
        )
        self.follower = follower()
        await self.accept()
        if self.channel_layer is not None:
            await self.channel_layer.group_add(tenant_group(self.tenant_id), self.channel_name)
        # Subscribed before the snapshot is rendered: whatever commits meanwhile is
        # pushed after it (at worst once more), never lost between the two.
        await self.follower.subscribe(self)
        await self.send(text_data=await live_sync_to_async(self._snapshot)())
        self._recheck_due(first=True)
        self.pusher = asyncio.create_task(self._push())

    async def disconnect(self, code: int) -> None:
        counted = getattr(self, "counted_user", None)
        if counted is not None:
            self.counted_user = None
            _open_sockets[counted] -= 1
            if _open_sockets[counted] <= 0:
                del _open_sockets[counted]
        recheck = getattr(self, "recheck", None)
        if recheck is not None:
            recheck.cancel()
        pusher = getattr(self, "pusher", None)
        if pusher is not None:
            pusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pusher
        if getattr(self, "follower", None) is not None:
            await self.follower.unsubscribe(self)
        operator = getattr(self, "operator", None)
        if operator is not None and self.channel_layer is not None:
            await self.channel_layer.group_discard(
                tenant_group(operator.tenant_id), self.channel_name
            )

    async def receive(self, text_data=None, bytes_data=None) -> None:
        # The page sends nothing the server acts on; actions are ordinary POSTs.
        return

    async def runs_poke(self, message) -> None:
        """A worker's hint (with Redis, on SQLite): the follower reads the tenant now."""
        self.follower.wake(self.tenant_id)

    def deliver(self, moved: Moved) -> None:
        """The follower's batch for this socket's tenant; rendered by ``_push``."""
        self.moved.append(moved)
        self.has_moved.set()

    def _recheck_due(self, *, first: bool = False) -> None:
        """The periodic access check is due: at the next multiple of RECHECK_SECONDS,
        on the process's clock shared by every socket (so those of one session fall
        due together and share one check). A timer per socket, not a timeout on each
        wait: a push to hundreds of pages would otherwise start a task and a timer
        for every one of them."""
        now = time.monotonic()
        if not first:
            self.recheck_at = now
            self.has_moved.set()
        due = (now // RECHECK_SECONDS + 1) * RECHECK_SECONDS
        self.recheck = asyncio.get_running_loop().call_later(due - now, self._recheck_due)

    async def _push(self) -> None:
        while True:
            await self.has_moved.wait()
            self.has_moved.clear()
            taken = time.monotonic()
            moved, self.moved = self.moved, []
            due, self.recheck_at = self.recheck_at, None
            try:
                fragments = await self._render(moved) if moved else ""
                if fragments or due is not None:
                    since = taken if fragments else due - RECHECK_SECONDS / 2
                    ended = await self.follower.checks.call(
                        (self.session_key, self.operator.user_id, self.tenant_id),
                        since,
                        lambda: live_sync_to_async(self._access_ended)(),
                    )
                    if ended:
                        await self._end(ended)
                        return
            except (OperationalError, InterfaceError) as exc:
                # The database is away (or locked): keep the socket and its batches,
                # wait, render again. live_sync_to_async closes the thread's
                # broken connection.
                self.moved[:0] = moved
                if due is not None and self.recheck_at is None:
                    self.recheck_at = due  # still owed once the database answers
                await asyncio.sleep(PAGES_OUTAGE.failed(exc) + 0.5)
                self.has_moved.set()
                continue
            PAGES_OUTAGE.recovered()
            if fragments:
                await self.send(text_data=fragments)

    async def _render(self, moved: list[Moved]) -> str:
        if self.page is not None:
            # A page keeps what it pushed: its own render.
            return await live_sync_to_async(self._changes)(moved)
        # Whatever else a socket pushes follows from who watches what, and the batches.
        key = (*self.render_key, tuple(batch.seq for batch in moved))
        return await self.follower.renders.call(
            key, 0.0, lambda: live_sync_to_async(self._changes)(moved)
        )

    async def _end(self, reason: str) -> None:
        """Tell the page why its updates stop, then close: nothing more is pushed."""
        context = {"reason": reason, "sign_in": True}
        await self.send(text_data=render_to_string("accounts/_live_notice.html", context))
        await self.close(code=4403)

    async def _refuse(self, code: int, reason: str, *, sign_in: bool = False) -> None:
        """Accept only to say why, then close with ``code``. A handshake refused outright
        reaches a browser as 1006, which it takes for an outage and retries every
        second or so; a close with a code of ours it does not retry."""
        await self.accept()
        context = {"reason": reason, "sign_in": sign_in}
        await self.send(text_data=render_to_string("accounts/_live_notice.html", context))
        await self.close(code=code)

    # --- database side (runs in a worker thread) --------------------------------

    def _operator(self, user):
        operator = getattr(user, "operator", None)
        if operator is None or not user.has_perm("accounts.view_runs"):
            return None
        return operator

    def _access_ended(self) -> str:
        """Why whoever opened this socket may no longer watch it, or "" while they may."""
        user_id = self.operator.user_id
        if self.session_key is None or not _session_of(self.session_key, user_id):
            return "you were signed out"
        user = get_user_model()._default_manager.filter(pk=user_id).first()
        if user is None or not user.is_active:
            return "your login was deactivated"
        operator = getattr(user, "operator", None)
        if operator is None or operator.tenant_id != self.operator.tenant_id:
            return "you are no longer an operator of this tenant"
        if not user.has_perm("accounts.view_runs"):
            return "you may no longer see runs"
        return ""

    def _open_page(self, factory, route):
        user, tenant = self.operator.user, self.operator.tenant
        request = _page_request(self.scope, user, tenant)
        return factory(Watcher(user, tenant, self.params, route.get("object_id"), request))

    def _visible(self) -> bool:
        if self.page is not None:
            return self.page.visible()
        if self.run_id is None:
            return True
        return Run.objects.filter(pk=self.run_id, tenant_id=self.operator.tenant_id).exists()

    @staticmethod
    def _in_zone(viewer):
        """Fragments pushed outside a request show times as the page did: in the
        operator's time zone as it is now (accounts.middleware)."""
        operator: Operator | None = getattr(viewer, "operator", None)
        return timezone.override(zone_of(operator) or UTC)

    def _snapshot(self) -> str:
        viewer = self._viewer()
        with self._in_zone(viewer):
            return self._snapshot_fragments(viewer)

    def _changes(self, moved: list[Moved]) -> str:
        viewer = self._viewer()
        with self._in_zone(viewer):
            return self._changed_fragments(
                viewer,
                [event for batch in moved for event in batch.events],
                [entry for batch in moved for entry in batch.audit],
            )

    def _snapshot_fragments(self, viewer) -> str:
        if self.navigation_only:
            return self._attention(viewer)
        if self.page is not None:
            return self.page.snapshot() + self._attention(viewer)
        if self.run_id is not None:
            return self._detail_fragments(viewer)
        return self._list_fragments(viewer)

    def _changed_fragments(self, viewer, events: list[tuple], entries: list[tuple]) -> str:
        if self.run_id is not None:
            events = [event for event in events if event[1] == self.run_id]
        fresh = [(i, run_id, kind) for i, run_id, kind in events]
        # The run list and the navigation show no audit entry.
        watches_audit = self.page is not None or self.run_id is not None
        audit = tuple(entry[1:] for entry in entries) if watches_audit else ()
        if not fresh and not audit:
            return ""
        if self.navigation_only:
            return self._attention(viewer)
        if self.page is not None:
            moved = Fresh(frozenset(run_id for _, run_id, _ in fresh), audit)
            return self.page.changes(moved) + self._attention(viewer)
        if self.run_id is not None:
            if fresh or self._audits_this_run(audit):
                return self._detail_fragments(viewer)
            return ""
        if not fresh:
            return ""
        created = {run_id for _, run_id, kind in fresh if kind == "created"}
        changed = list(Run.objects.filter(pk__in={run_id for _, run_id, _ in fresh}))
        if any(run.id in created and run_matches(run, self.params) for run in changed):
            # A new run belongs on this page: render the page again (it may have
            # been empty, with no table to add a row to).
            return self._list_fragments(viewer)
        parts = []
        perms = PermWrapper(viewer)  # a row's checkbox is for who may act on it
        for run in changed:
            if run_matches(run, self.params):
                context = {"run": run, "oob": "true", "perms": perms}
                parts.append(render_to_string("agentruns/run_list.html#row", context))
            else:
                # It left this tab's state (or never matched): not on this page.
                parts.append(f'<tr id="run-{run.id}" hx-swap-oob="delete"></tr>')
        context = run_tabs_context(self.operator.tenant, self.params)
        parts.append(render_to_string("agentruns/run_list.html#tabs", {**context, "oob": True}))
        parts.append(self._attention(viewer))
        return "".join(parts)

    def _list_fragments(self, viewer) -> str:
        context = {
            **run_list_context(self.operator.tenant, self.params),
            "oob": True,
            "perms": PermWrapper(viewer),
        }
        return (
            render_to_string("agentruns/run_list.html#run_table", context)
            + render_to_string("agentruns/run_list.html#tabs", context)
            + self._attention(viewer)
        )

    def _audits_this_run(self, audit: tuple[tuple[str, str, str], ...]) -> bool:
        """Whether an audit entry is about this run, or an approval or case of it."""
        if not audit:
            return False
        objects = {(kind, object_id) for kind, object_id, _ in audit}
        if ("run", str(self.run_id)) in objects:
            return True
        run = Run.objects.get(pk=self.run_id)
        approvals = {str(pk) for pk in run.approvals.values_list("pk", flat=True)}
        cases = {str(pk) for pk in run.cases.values_list("pk", flat=True)}
        return any(
            (kind == "approval" and object_id in approvals)
            or (kind == "case" and object_id in cases)
            for kind, object_id in objects
        )

    def _detail_fragments(self, viewer) -> str:
        run = Run.objects.select_related("tenant").get(pk=self.run_id)
        context = {**run_detail_context(run, viewer), "oob": True}
        return (
            render_to_string("agentruns/run_detail.html#summary", context)
            + render_to_string("agentruns/run_detail.html#timeline", context)
            + render_to_string("agentruns/run_detail.html#events", context)
            + render_to_string("agentruns/run_detail.html#audit", context)
            + self._attention(viewer)
        )

    def _viewer(self):
        """The watching user as the database has them now, with their operator: what
        a fragment offers (the Audit link, cancel, provider errors) follows their
        permissions of now, and its times their time zone. One per render: its
        permissions are read once, for every fragment of it."""
        users = get_user_model()._default_manager.select_related("operator")
        return users.get(pk=self.operator.user_id)

    def _attention(self, viewer) -> str:
        context = {
            "attention": attention_for(self.operator.tenant),
            "oob": True,
            # Rendered outside a request: the permissions the page's own render read.
            "perms": PermWrapper(viewer),
        }
        return render_to_string("accounts/_attention.html", context)


def _page_request(scope, user, tenant) -> HttpRequest:
    """The request a live page's fragments are rendered with: the page's query (for
    ``{% querystring %}``), its user and tenant, and the browser's CSRF cookie, so a
    pushed form carries a token the page's next POST passes with."""
    request = HttpRequest()
    request.method = "GET"
    request.path = scope.get("path", "")
    request.GET = QueryDict(scope.get("query_string", b"").decode())
    request.user = user
    request.tenant = tenant
    csrf_cookie = scope.get("cookies", {}).get(settings.CSRF_COOKIE_NAME)
    if csrf_cookie:
        request.META["CSRF_COOKIE"] = csrf_cookie
    return request


def _session_of(session_key: str, user_id: int) -> bool:
    """Whether the session still exists (not logged out, not expired) and is this user's."""
    store: SessionBase = import_string(f"{settings.SESSION_ENGINE}.SessionStore")(session_key)
    # Loading answers nothing for a session that was flushed (logout) or has expired.
    return str(store.get(SESSION_KEY)) == str(user_id)
