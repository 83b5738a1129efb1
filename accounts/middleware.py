from __future__ import annotations

import zoneinfo

from django.utils import timezone


class OperatorTimezoneMiddleware:
    """Show times in the operator's own time zone."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        operator = getattr(request.user, "operator", None) if hasattr(request, "user") else None
        zone = None
        if operator is not None:
            try:
                zone = zoneinfo.ZoneInfo(operator.time_zone)
            except (zoneinfo.ZoneInfoNotFoundError, ValueError):
                zone = None
        if zone is not None:
            timezone.activate(zone)
        else:
            timezone.deactivate()
        return self.get_response(request)
