"""The webhooks pages: a tenant's endpoints, made, changed, rotated and disabled by
those who may manage them (``webhooks.manage_webhooks``), and each endpoint's
delivery log, live (``webhooks.live``).

A new or rotated secret is shown once, in the answer to the POST that made it
(``Cache-Control: no-store``), never in a message, a log line or another page.
"""

from __future__ import annotations

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from accounts.access import operator_required
from webhooks.forms import EndpointForm
from webhooks.models import WebhookEndpoint
from webhooks.selectors import delivery_log, endpoint_of, endpoints_of
from webhooks.services import (
    EndpointRefused,
    endpoint_create,
    endpoint_rotate,
    endpoint_set_active,
    endpoint_update,
)

MANAGE = "webhooks.manage_webhooks"


def _endpoint_or_404(request: HttpRequest, endpoint_id: int) -> WebhookEndpoint:
    endpoint = endpoint_of(request.tenant, endpoint_id)
    if endpoint is None:
        raise Http404("No such webhook endpoint.")
    return endpoint


def _secret_page(request: HttpRequest, endpoint: WebhookEndpoint, secret: str, *, rotated: bool):
    response = render(
        request,
        "webhooks/secret.html",
        {"endpoint": endpoint, "secret": secret, "rotated": rotated},
    )
    # Shown once: no cache, no back button, keeps it.
    response["Cache-Control"] = "no-store"
    return response


@require_GET
@operator_required(MANAGE)
def webhook_list(request: HttpRequest) -> HttpResponse:
    return render(request, "webhooks/list.html", {"endpoints": endpoints_of(request.tenant)})


@require_http_methods(["GET", "POST"])
@operator_required(MANAGE)
def webhook_create(request: HttpRequest) -> HttpResponse:
    form = EndpointForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            endpoint, secret = endpoint_create(
                tenant=request.tenant, user=request.user, request=request, **form.cleaned_data
            )
        except EndpointRefused as refused:
            form.add_error(None, str(refused))
        else:
            return _secret_page(request, endpoint, secret, rotated=False)
    status = 400 if request.method == "POST" else 200
    return render(request, "webhooks/form.html", {"form": form, "endpoint": None}, status=status)


@require_GET
@operator_required(MANAGE)
def webhook_detail(request: HttpRequest, endpoint_id: int) -> HttpResponse:
    endpoint = _endpoint_or_404(request, endpoint_id)
    context = {"endpoint": endpoint, "rows": delivery_log(endpoint)}
    return render(request, "webhooks/endpoint.html", context)


@require_http_methods(["GET", "POST"])
@operator_required(MANAGE)
def webhook_edit(request: HttpRequest, endpoint_id: int) -> HttpResponse:
    endpoint = _endpoint_or_404(request, endpoint_id)
    initial = {"url": endpoint.url, "description": endpoint.description, "events": endpoint.events}
    form = EndpointForm(request.POST or None, initial=initial)
    if request.method == "POST" and form.is_valid():
        try:
            endpoint_update(
                endpoint=endpoint, user=request.user, request=request, **form.cleaned_data
            )
        except EndpointRefused as refused:
            form.add_error(None, str(refused))
        else:
            return redirect("webhook-detail", endpoint_id=endpoint.pk)
    status = 400 if request.method == "POST" else 200
    return render(
        request, "webhooks/form.html", {"form": form, "endpoint": endpoint}, status=status
    )


@require_POST
@operator_required(MANAGE)
def webhook_rotate(request: HttpRequest, endpoint_id: int) -> HttpResponse:
    endpoint = _endpoint_or_404(request, endpoint_id)
    secret = endpoint_rotate(endpoint=endpoint, user=request.user, request=request)
    return _secret_page(request, endpoint, secret, rotated=True)


@require_POST
@operator_required(MANAGE)
def webhook_disable(request: HttpRequest, endpoint_id: int) -> HttpResponse:
    endpoint = _endpoint_or_404(request, endpoint_id)
    endpoint_set_active(endpoint=endpoint, active=False, user=request.user, request=request)
    return redirect("webhook-detail", endpoint_id=endpoint.pk)


@require_POST
@operator_required(MANAGE)
def webhook_enable(request: HttpRequest, endpoint_id: int) -> HttpResponse:
    endpoint = _endpoint_or_404(request, endpoint_id)
    endpoint_set_active(endpoint=endpoint, active=True, user=request.user, request=request)
    return redirect("webhook-detail", endpoint_id=endpoint.pk)
