from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path, re_path
from django.views.generic import RedirectView

from accounts import views as accounts_views
from api import errors as api_errors
from api import legacy as api_legacy
from api import v1 as api_v1
from config import health, metrics

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="run-list", permanent=False)),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("audit/", accounts_views.audit_list, name="audit-list"),
    path("accounts/preferences/", accounts_views.preferences, name="preferences"),
    path("admin/", admin.site.urls),
    # For load balancers, orchestrators and Prometheus: no login (config/health.py).
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", metrics.metrics_view, name="metrics"),
    # The API (api/v1.py; docs/api.md), and its two addresses from before v1.
    path("api/v1/", api_v1.urls),
    path("api/", api_legacy.urls),
    path("", include("agentruns.urls")),
    path("", include("approvals.urls")),
    path("", include("reconciliation.urls")),
    path("", include("evidence.urls")),
    path("", include("overview.urls")),
    path("", include("bulk.urls")),
    path("", include("webhooks.urls")),
    # Last: every other address under /api/ is a JSON 404, never the site's HTML page.
    re_path(r"^api/(?P<path>.*)$", api_errors.not_found, name="api-not-found"),
]
