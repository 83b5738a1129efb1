"""The API, version 1, at /api/v1/: one router per area, mounted here.

A new area is one ``api.add_router`` line below. Every operation authenticates with a
bearer token (``api.auth``), answers errors in one JSON shape (``api.errors``), reads
bodies within the API's limits (``api.parser``) and pages lists by cursor
(``api.pagination``). The OpenAPI document (/api/v1/openapi.json) and the interactive
documentation (/api/v1/docs, Swagger UI from django-ninja's own static files, no CDN)
are generated from this code; docs/api.md explains the rest.
"""

from __future__ import annotations

from ninja import Swagger

from api import approvals, audit, cases, runs
from api.docs import docs_access
from api.errors import json_urls
from api.frame import HoldfastAPI

DESCRIPTION = """\
Holdfast runs AI agents as durable workflows. This API lets the systems around it do
what an operator does in the console: start runs and follow them, cancel them or make
them retry now, decide approvals, settle reconciliation cases, and read the audit log.

**Authentication.** Every request carries `Authorization: Bearer hft_…`, a token issued
to an operator (`manage.py createapitoken NAME --owner USERNAME`, or in the admin). The
token acts as its owner: in the owner's tenant, with the owner's permissions. Each
operation names the **scope** the token must carry and the **permission** its owner must
hold; either missing is a 403 that says which.

**Errors.** Every error is JSON: `{"error": "why", "errors": {"field": ["why"]}}`,
`errors` only when fields were wrong (400). 401: no valid token. 403: scope or
permission missing. 404: no such object in the token's tenant (another tenant's objects
are never found). 405: wrong method. 409: the object's state does not allow it, with
the reason. 413: the body is larger than the deployment allows.

**Lists** are newest first and paged by cursor: pass the page's `next_cursor` as
`cursor` for the next one; rows inserted meanwhile never repeat or hide a row.
"""

api = HoldfastAPI(
    title="Holdfast API",
    version="1",
    description=DESCRIPTION,
    urls_namespace="api-v1",
    docs=Swagger(settings={"persistAuthorization": False}),
    docs_url="/docs",
    openapi_url="/openapi.json",
    docs_decorator=docs_access,
)

api.add_router("/runs", runs.router, tags=["runs"])
api.add_router("/approvals", approvals.router, tags=["approvals"])
api.add_router("/cases", cases.router, tags=["cases"])
api.add_router("/audit", audit.router, tags=["audit"])

urls = json_urls(api.urls)
