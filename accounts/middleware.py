from __future__ import annotations

import zoneinfo

from django.utils import timezone


def zone_of(operator) -> zoneinfo.ZoneInfo | None:
    """The time zone ``operator`` reads times in, or None (UTC) when it is not one."""
    if operator is None:
        return None
    try:
        return zoneinfo.ZoneInfo(operator.time_zone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return None


class OperatorTimezoneMiddleware:
    """Show times in the operator's own time zone (live pages: agentruns.consumers)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        operator = getattr(request.user, "operator", None) if hasattr(request, "user") else None
        zone = zone_of(operator)
        if zone is not None:
            timezone.activate(zone)
        else:
            timezone.deactivate()
        return self.get_response(request)
