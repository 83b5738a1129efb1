"""Who may read the API's documentation: the interactive page and its OpenAPI document.

Logged-in operators of a tenant, whatever their role, as for every page of the console:
the document names every address and field of this deployment, which is nobody's
business outside it, and whoever may hold a token (it is issued to an operator) can log
in to read it. A code generator takes the document from
``manage.py export_openapi_schema --api api.v1.api`` rather than over HTTP.
"""

from __future__ import annotations

from functools import wraps

from accounts.access import operator_required
from api.errors import error_response


def docs_access(view):
    """``view`` for logged-in operators (others go to the login page), read-only: any
    other method is the API's JSON 405, as everywhere under /api/."""
    page = operator_required("")(view)

    @wraps(view)
    def wrapper(request, *args, **kwargs):
        if request.method not in ("GET", "HEAD"):
            return error_response(
                405,
                f"{request.method} is not allowed here; use GET",
                headers={"Allow": "GET, HEAD"},
            )
        return page(request, *args, **kwargs)

    return wrapper
