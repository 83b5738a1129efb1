"""The sandbox's HTTP server: stdlib, not Django's view stack, so a fault can drop a socket.

One thread per connection; each request uses the ORM on the ``sandbox`` database and
closes its connections when it is done. Routes:

- ``/v1/...``: Stripe's payments API: ``GET /v1/payment_intents/<id>``, ``POST
  /v1/refunds``, ``GET /v1/refunds/<id>``, ``GET /v1/refunds`` (``payment_intent``,
  ``limit``, ``starting_after``, ``ending_before``);
- ``/shop/orders/<id>``: the shop, a partner API read with the same key;
- ``/hooks/<channel>``: incoming webhooks (``sandbox.webhooks``), deduplicated by
  ``Idempotency-Key`` (or a Standard Webhooks ``webhook-id``), and
  ``/hooks/<channel>/deliveries/<key>`` to look one up;
- ``/_sandbox/...``: stats, the request log (``GET /_sandbox/requests?api_key=`` or
  ``?account=``), received mail, faults (HTTP and SMTP), reset and seed (JSON
  ``api_key`` and ``first_number``) and the test clock.

Authentication: ``/_sandbox`` needs the sandbox's control token, and a JSON content
type on POST and DELETE (``sandbox.control``); OPTIONS is a 405 with no CORS headers, so
no browser sends another site's request to either kind of route. ``/v1`` and ``/shop``
need an API key, ``Authorization: Bearer <key>`` (or Basic with the key as user name);
without one they answer 401 ``authentication_error``. The key alone names the account
(``sandbox.accounts``), and every read and write sees only that account's payment
intents, refunds and orders: another account's object is the same 404
``resource_missing`` as one that does not exist.

Every ``/v1`` and ``/shop`` request, 401s, errors and faults included, is written to the
request log (``sandbox.requestlog``) before its reply is sent.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, unquote_plus, urlsplit

from django.db import connections

from sandbox import (
    clock,
    control,
    faults,
    idempotency,
    payments,
    requestlog,
    seed,
    shop,
    webhooks,
)
from sandbox.accounts import account_for
from sandbox.models import Fault
from sandbox.responses import ApiError, Response, api_error, json_response, new_id
from sandbox.stats import effect_stats, recent_messages

logger = logging.getLogger("sandbox.http")

# The provider's own routes: authenticated, scoped to an account, and logged.
PROVIDER_PREFIXES = ("/v1/", "/shop/")


class SandboxHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64

    def __init__(self, address: tuple[str, int], service: SandboxService) -> None:
        super().__init__(address, SandboxHandler)
        self.service = service


class SandboxHandler(BaseHTTPRequestHandler):
    server: SandboxHTTPServer
    server_version = "HoldfastSandbox/1.0"

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def do_DELETE(self) -> None:
        self._serve()

    def do_OPTIONS(self) -> None:
        self._serve()

    def log_message(self, format: str, *args: Any) -> None:
        # One line per request is logged by _serve; silence http.server's own.
        return

    # --- plumbing --------------------------------------------------------------------

    def _serve(self) -> None:
        started = time.monotonic()
        received_at = clock.now()
        url = urlsplit(self.path)
        self._after_reply: Callable[[], None] | None = None
        self._fault: Fault | None = None
        self._account = ""
        try:
            response = self._answer(url.path, url.query)
            if url.path.startswith(PROVIDER_PREFIXES):
                # Before the reply: a client that got an answer always finds its row.
                self._record(response, received_at)
        finally:
            connections.close_all()
        request_id = new_id("req_", 14)
        if response.drop:
            self._drop()
        else:
            self._send(response, request_id)
        logger.info(
            "%s %s -> %s %.0fms %s%s%s",
            self.command,
            self.path,
            "dropped" if response.drop else response.status,
            (time.monotonic() - started) * 1000,
            request_id,
            " replayed" if response.headers.get("Idempotent-Replayed") else "",
            f" fault={self._fault.kind}" if self._fault else "",
        )
        if self._after_reply is not None:
            self._after_reply()

    def _answer(self, path: str, query: str) -> Response:
        try:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            return self._route(self.command, path, query, body)
        except ApiError as error:
            return error.response()
        except Exception:
            logger.exception("%s %s failed", self.command, path)
            # The failure may have left a connection unusable: the log row gets a new one.
            connections.close_all()
            return api_error().response()

    def _record(self, response: Response, received_at: datetime) -> None:
        try:
            requestlog.record(
                account=self._account,
                method=self.command,
                path=self.path,
                status=None if response.drop else response.status,
                fault=self._fault.kind if self._fault else "",
                received_at=received_at,
            )
        except Exception:
            # The log is the sandbox's own bookkeeping: the caller still gets its answer.
            logger.warning("could not record %s %s", self.command, self.path, exc_info=True)

    def _send(self, response: Response, request_id: str) -> None:
        payload = response.body.encode()
        self.send_response(response.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("Request-Id", request_id)
        for name, value in response.headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(payload)

    def _drop(self) -> None:
        """Close the connection without a byte of reply: the caller cannot know the outcome."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def _route(self, method: str, path: str, query: str, body: bytes) -> Response:
        if method == "OPTIONS":
            # A CORS preflight, answered without any Access-Control-Allow-* header: the
            # browser then never sends another site's request with the headers it asked for.
            raise ApiError(405, f"{method} is not allowed.", headers={"Allow": "GET, POST, DELETE"})
        if path.startswith("/_sandbox/"):
            control.authorize(
                method=method, headers=self.headers, token=self.server.service.control_token
            )
            return self._sandbox_route(method, path, query, body)
        if path.startswith("/v1/"):
            api_key = self._api_key()
            account = self._account = account_for(api_key)
            scope = idempotency.scope_for(api_key, self.headers.get("Stripe-Account", ""))
            return self._with_faults(
                method,
                path,
                lambda fault: self._stripe(method, path, query, body, account, scope, fault),
            )
        if path.startswith("/shop/"):
            account = self._account = account_for(self._api_key())
            return self._with_faults(
                method,
                path,
                lambda fault: _around(fault, lambda: self._shop(method, path, account)),
            )
        if path.startswith("/hooks/"):
            # No API key: like a chat's hook URL, the channel in the address is the secret.
            return self._with_faults(
                method, path, lambda fault: _around(fault, lambda: self._hook(method, path, body))
            )
        raise _unrecognized(method, path)

    def _hook(self, method: str, path: str, body: bytes) -> Response:
        parts = [unquote_plus(part) for part in path.strip("/").split("/")]
        if method == "POST" and len(parts) == 2:
            return webhooks.deliver(
                parts[1],
                body,
                key=self.headers.get("Idempotency-Key", ""),
                signature=self.headers.get("webhook-signature")
                or self.headers.get("X-Holdfast-Signature", ""),
                message_id=self.headers.get("webhook-id", ""),
                timestamp=self.headers.get("webhook-timestamp", ""),
            )
        if method == "GET" and len(parts) == 4 and parts[2] == "deliveries":
            return webhooks.delivery_for(parts[1], parts[3])
        raise _unrecognized(method, path)

    def _with_faults(
        self, method: str, path: str, handle: Callable[[Fault | None], Response]
    ) -> Response:
        fault = self._fault = faults.take(method, path)
        kind = fault.kind if fault else None
        if kind == Fault.Kind.RATE_LIMIT:
            # Stripe's rate limiter runs before the idempotency layer: nothing is saved.
            raise ApiError(
                429,
                "Request rate limit exceeded. You can learn more about rate limits here "
                "https://stripe.com/docs/rate-limits.",
                code="rate_limit",
                headers={"Retry-After": str(fault.retry_after)},
            )
        if kind == Fault.Kind.ERROR_BEFORE:
            raise api_error()
        response = handle(fault)
        if kind == Fault.Kind.DROP_AFTER_COMMIT:
            response.drop = True
        return response

    def _api_key(self) -> str:
        """The caller's API key, from Bearer auth or Basic's user name; 401 without one."""
        header = self.headers.get("Authorization", "")
        scheme, _, credentials = header.partition(" ")
        api_key = ""
        if scheme.lower() == "bearer":
            api_key = credentials.strip()
        elif scheme.lower() == "basic":
            try:
                api_key = base64.b64decode(credentials).decode().partition(":")[0]
            except ValueError:
                api_key = ""
        if not api_key:
            raise ApiError(
                401,
                "You did not provide an API key. You need to provide your API key in the "
                "Authorization header, using Bearer auth (e.g. 'Authorization: Bearer "
                "YOUR_SECRET_KEY').",
                type="authentication_error",
            )
        return api_key

    # --- Stripe ----------------------------------------------------------------------

    def _stripe(
        self,
        method: str,
        path: str,
        query: str,
        body: bytes,
        account: str,
        scope: str,
        fault: Fault | None,
    ) -> Response:
        if method == "POST" and path == "/v1/refunds":
            return self._refund_create(path, body, account, scope, fault)
        return _around(fault, lambda: self._stripe_read(method, path, query, account))

    def _stripe_read(self, method: str, path: str, query: str, account: str) -> Response:
        params = payments.parse_params(parse_qsl(query, keep_blank_values=True))
        parts = path.strip("/").split("/")
        if method == "GET" and parts == ["v1", "refunds"]:
            return json_response(200, payments.refund_list(params, account=account))
        if method == "GET" and len(parts) == 3 and parts[:2] == ["v1", "refunds"]:
            refund_id = unquote_plus(parts[2])
            return json_response(200, payments.refund_retrieve(refund_id, account=account))
        if method == "GET" and len(parts) == 3 and parts[:2] == ["v1", "payment_intents"]:
            intent_id = unquote_plus(parts[2])
            return json_response(
                200, payments.payment_intent_retrieve(intent_id, params, account=account)
            )
        raise _unrecognized(method, path)

    def _refund_create(
        self, path: str, body: bytes, account: str, scope: str, fault: Fault | None
    ) -> Response:
        pairs = parse_qsl(body.decode("utf-8", errors="replace"), keep_blank_values=True)
        key = self.headers.get("Idempotency-Key", "")
        echo = {"Idempotency-Key": key} if key else {}
        record = None
        if key:
            claim = idempotency.claim(
                scope=scope,
                key=key,
                method="POST",
                path=path,
                params=idempotency.fingerprint(pairs),
            )
            if claim.answer is not None:
                claim.answer.headers.update(echo)
                return claim.answer
            record = claim.record
        try:
            request = payments.validate_refund_create(payments.parse_params(pairs))
            _sleep_for(fault)
            # The refund and its saved answer commit together, or neither does.
            with payments.atomic():
                try:
                    with payments.atomic():
                        response = json_response(
                            200,
                            payments.refund_create(request, account=account, idempotency_key=key),
                        )
                except ApiError as error:
                    # Execution began: Stripe saves and replays this error too.
                    response = error.response()
                response = _error_after(response, fault)
                if record is not None:
                    idempotency.save(record, response)
        except BaseException:
            if record is not None:
                # Nothing was executed (or it rolled back): the key is free again.
                idempotency.release(record)
            raise
        response.headers.update(echo)
        return response

    # --- shop ------------------------------------------------------------------------

    def _shop(self, method: str, path: str, account: str) -> Response:
        parts = path.strip("/").split("/")
        if method == "GET" and len(parts) == 3 and parts[:2] == ["shop", "orders"]:
            order_id = unquote_plus(parts[2])
            return json_response(200, shop.order_retrieve(order_id, account=account))
        raise _unrecognized(method, path)

    # --- sandbox-only ----------------------------------------------------------------

    def _sandbox_route(self, method: str, path: str, query: str, body: bytes) -> Response:
        route = (method, path.rstrip("/"))
        if route == ("GET", "/_sandbox/stats"):
            return json_response(200, effect_stats())
        if route == ("GET", "/_sandbox/requests"):
            account = _logged_account(query)
            return json_response(200, {"requests": requestlog.recent(account=account)})
        if route == ("GET", "/_sandbox/messages"):
            return json_response(200, {"messages": recent_messages()})
        if route == ("GET", "/_sandbox/webhooks"):
            return json_response(200, {"deliveries": webhooks.recent_deliveries()})
        if route == ("GET", "/_sandbox/faults"):
            return json_response(200, {"faults": faults.armed()})
        if route == ("POST", "/_sandbox/faults"):
            fault = faults.arm(_json_body(body))
            if fault.kind == Fault.Kind.REFUSE:
                service = self.server.service
                self._after_reply = lambda: service.refuse_for(fault.delay_seconds)
            return json_response(200, faults.fault_json(fault))
        if route == ("DELETE", "/_sandbox/faults"):
            return json_response(200, {"cleared": faults.clear()})
        if route == ("POST", "/_sandbox/reset"):
            spec = _json_body(body)
            api_key, first_number = _seed_args(spec)
            # One transaction: a refused seed leaves the records as they were.
            with payments.atomic():
                seed.wipe()
                created = seed.seed(api_key, first_number) if spec.get("seed") else []
            return json_response(
                200,
                {
                    "reset": True,
                    "seeded": [order for order, _ in created],
                    "account": account_for(api_key) if created else None,
                },
            )
        if route == ("POST", "/_sandbox/seed"):
            api_key, first_number = _seed_args(_json_body(body))
            created = seed.seed(api_key, first_number)
            return json_response(
                200, {"seeded": [order for order, _ in created], "account": account_for(api_key)}
            )
        if route == ("GET", "/_sandbox/clock"):
            return json_response(200, {"now": clock.now().isoformat()})
        if route == ("POST", "/_sandbox/clock"):
            try:
                seconds = float(_json_body(body).get("advance", 0))
            except (TypeError, ValueError) as exc:
                raise ApiError(400, "advance must be a number of seconds") from exc
            return json_response(200, {"now": clock.advance(seconds).isoformat()})
        raise _unrecognized(method, path)


def _json_body(body: bytes) -> dict[str, Any]:
    if not body.strip():
        return {}
    try:
        parsed = json.loads(body)
    except ValueError as exc:
        raise ApiError(400, f"Invalid JSON body: {exc}") from exc
    if not isinstance(parsed, dict):
        raise ApiError(400, "The JSON body must be an object")
    return parsed


def _seed_args(spec: dict[str, Any]) -> tuple[str, int]:
    """``api_key`` and ``first_number`` of a seed or reset body; the demo account's without."""
    api_key = spec.get("api_key", seed.DEMO_API_KEY)
    first_number = spec.get("first_number", seed.DEMO_FIRST_NUMBER)
    if not isinstance(api_key, str):
        raise ApiError(400, "api_key must be a non-empty string", param="api_key")
    if not isinstance(first_number, int) or isinstance(first_number, bool):
        raise ApiError(400, "first_number must be an integer", param="first_number")
    return api_key, first_number


def _logged_account(query: str) -> str | None:
    """Whose requests ``GET /_sandbox/requests`` lists: None for everyone's.

    ``?api_key=`` names the account by its key, ``?account=`` by its id (empty: the
    requests that carried no key).
    """
    params = dict(parse_qsl(query, keep_blank_values=True))
    if "api_key" in params and "account" in params:
        raise ApiError(400, "Pass api_key or account, not both.")
    if "api_key" in params:
        if not params["api_key"]:
            raise ApiError(400, "api_key must not be empty", param="api_key")
        return account_for(params["api_key"])
    return params.get("account")


def _unrecognized(method: str, path: str) -> ApiError:
    return ApiError(404, f"Unrecognized request URL ({method}: {path}).")


def _sleep_for(fault: Fault | None) -> None:
    if fault is not None and fault.kind == Fault.Kind.DELAY:
        time.sleep(fault.delay_seconds)


def _around(fault: Fault | None, handle: Callable[[], Response]) -> Response:
    """Delay and error-after faults for a request with no idempotency layer in between."""
    _sleep_for(fault)
    return _error_after(handle(), fault)


def _error_after(response: Response, fault: Fault | None) -> Response:
    """The effect committed, but the caller hears a 500 (saved under the key like Stripe)."""
    if fault is None or fault.kind != Fault.Kind.ERROR_AFTER:
        return response
    error = api_error().response()
    # Stripe marks most 500s not retryable: its idempotency layer would replay them anyway.
    error.headers["Stripe-Should-Retry"] = "false"
    return error


class SandboxService:
    """The HTTP server (restartable, for the ``refuse`` fault) and the SMTP sink."""

    def __init__(self, host: str, port: int, smtp_port: int, *, control_token: str) -> None:
        self.host = host
        self.port = port
        self.smtp_port = smtp_port
        # What every /_sandbox/ request must present (sandbox.control).
        self.control_token = control_token
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._httpd: SandboxHTTPServer | None = None
        self._smtp = None

    def start(self) -> None:
        from aiosmtpd.controller import Controller

        from sandbox.mail import SinkHandler

        self._start_http()
        self._smtp = Controller(SinkHandler(), hostname=self.host, port=self.smtp_port)
        self._smtp.start()

    def _start_http(self) -> None:
        self._httpd = SandboxHTTPServer((self.host, self.port), self)
        thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.1},
            name="sandbox-http",
            daemon=True,
        )
        thread.start()

    def _stop_http(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def refuse_for(self, seconds: float) -> None:
        """Close the listening socket, so connections are refused, and reopen it later."""

        def refuse() -> None:
            with self._lock:
                if self._stopping.is_set():
                    return
                self._stop_http()
                logger.info("refusing connections for %.1fs", seconds)
                if not self._stopping.wait(seconds):
                    self._start_http()
                    logger.info("accepting connections again")

        threading.Thread(target=refuse, name="sandbox-refuse", daemon=True).start()

    def stop(self) -> None:
        self._stopping.set()
        with self._lock:
            self._stop_http()
        if self._smtp is not None:
            self._smtp.stop()
            self._smtp = None
