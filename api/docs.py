"""Who may read the API's documentation: the interactive page and its OpenAPI document.

Logged-in operators of a tenant, whatever their role, as for every page of the console:
the document names every address and field of this deployment, which is nobody's
business outside it, and whoever may hold a token (it is issued to an operator) can log
in to read it. A code generator takes the document from
``manage.py export_openapi_schema --api api.v1.api`` rather than over HTTP.
"""

from __future__ import annotations

from functools import wraps

from django.views.decorators.http import require_safe

from accounts.access import operator_required


def docs_access(view):
    @wraps(view)
    def wrapper(request, *args, **kwargs):
        return view(request, *args, **kwargs)

    return require_safe(operator_required("")(wrapper))
