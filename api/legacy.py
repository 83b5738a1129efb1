"""The two addresses the runs API had before it was versioned, kept working as they were.

``POST /api/runs`` and ``GET /api/runs/<id>`` answer exactly what ``/api/v1/runs`` and
``/api/v1/runs/<id>`` answer (the same operations, the same token rules and errors;
the read has gained the v1 step fields); any other method is a JSON 405, as before.
They are served rather than redirected: a client that does not follow redirects, or
drops the Authorization header when it does, keeps working. They are left out of the
OpenAPI document, which describes v1 alone.
"""

from __future__ import annotations

from accounts.models import ApiToken
from api import runs
from api.auth import TokenAuth
from api.errors import json_urls
from api.frame import HoldfastAPI

legacy = HoldfastAPI(
    title="Holdfast runs API (before v1)",
    version="0",
    urls_namespace="api-legacy",
    docs_url=None,
    openapi_url=None,
)
legacy.default_router.add_api_operation(
    "/runs",
    ["POST"],
    runs.runs_start,
    response=runs.START_RESPONSE,
    auth=TokenAuth(ApiToken.SCOPE_START),
    url_name="api-start-run",
)
legacy.default_router.add_api_operation(
    "/runs/{uuid:run_id}",
    ["GET"],
    runs.runs_read,
    response=runs.READ_RESPONSE,
    auth=TokenAuth(ApiToken.SCOPE_READ),
    url_name="api-get-run",
)

urls = json_urls(legacy.urls)
