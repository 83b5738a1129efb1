"""With DEBUG off Holdfast is served as a production site: HTTPS only, Secure and HttpOnly
cookies, HSTS, the client's address through trusted proxies, no published demo logins.

Settings are read once, at import, so what the environment makes of them is checked in
a fresh process; what the middleware does with them, in this one.
"""

from __future__ import annotations

import io
import json
import os
import secrets
import subprocess
import sys

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.test import RequestFactory

from accounts.client_address import client_address
from accounts.models import AuditEntry
from tests.harness import ROOT

PRODUCTION = {
    "DJANGO_DEBUG": "false",
    "DJANGO_ALLOWED_HOSTS": "holdfast.example.com",
    "DJANGO_CSRF_TRUSTED_ORIGINS": "https://holdfast.example.com",
}
SECURITY_SETTINGS = (
    "DEBUG",
    "SESSION_COOKIE_SECURE",
    "SESSION_COOKIE_HTTPONLY",
    "CSRF_COOKIE_SECURE",
    "CSRF_COOKIE_HTTPONLY",
    "SECURE_HSTS_SECONDS",
    "SECURE_HSTS_INCLUDE_SUBDOMAINS",
    "SECURE_SSL_REDIRECT",
    "SECURE_REDIRECT_EXEMPT",
    "SECURE_PROXY_SSL_HEADER",
    "HOLDFAST_TRUSTED_PROXIES",
)


def _environment(tmp_path, **overrides: str) -> dict[str, str]:
    # Nothing of this test run's own settings (its key, its redirect switch, its
    # database) reaches the process: only the production environment given here.
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("DJANGO_", "HOLDFAST_")) and name != "DATABASE_URL"
    }
    env.update(PRODUCTION)
    env["DJANGO_SECRET_KEY"] = secrets.token_urlsafe(50)
    env["HOLDFAST_VAR_DIR"] = str(tmp_path)
    env["DJANGO_SETTINGS_MODULE"] = "config.settings"
    env.update(overrides)
    return env


def _settings_in(tmp_path, **overrides: str) -> dict:
    script = (
        "import json, django; from django.conf import settings; django.setup(); "
        f"print(json.dumps({{n: getattr(settings, n, None) for n in {SECURITY_SETTINGS!r}}}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=_environment(tmp_path, **overrides),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_check_deploy_is_clean_with_production_settings(tmp_path):
    done = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=_environment(tmp_path, HOLDFAST_TRUSTED_PROXIES="10.0.0.0/8"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # HSTS preloading is the one check silenced, with its reason in config/settings.py.
    assert "System check identified no issues (1 silenced)." in done.stdout


def test_with_debug_off_cookies_hsts_and_the_redirect_are_on(tmp_path):
    assert _settings_in(tmp_path) == {
        "DEBUG": False,
        "SESSION_COOKIE_SECURE": True,
        "SESSION_COOKIE_HTTPONLY": True,
        "CSRF_COOKIE_SECURE": True,
        "CSRF_COOKIE_HTTPONLY": True,
        "SECURE_HSTS_SECONDS": 365 * 24 * 3600,
        "SECURE_HSTS_INCLUDE_SUBDOMAINS": True,
        "SECURE_SSL_REDIRECT": True,
        "SECURE_REDIRECT_EXEMPT": ["^healthz$", "^readyz$"],
        # No proxy named: no header is believed.
        "SECURE_PROXY_SSL_HEADER": None,
        "HOLDFAST_TRUSTED_PROXIES": [],
    }


def test_the_environment_tunes_them_and_names_the_proxies(tmp_path):
    tuned = _settings_in(
        tmp_path,
        HOLDFAST_SSL_REDIRECT="false",
        HOLDFAST_HSTS_SECONDS="600",
        HOLDFAST_HSTS_INCLUDE_SUBDOMAINS="false",
        HOLDFAST_TRUSTED_PROXIES="10.0.0.0/8, 2001:db8::1",
    )
    assert tuned["SECURE_SSL_REDIRECT"] is False
    assert tuned["SECURE_HSTS_SECONDS"] == 600
    assert tuned["SECURE_HSTS_INCLUDE_SUBDOMAINS"] is False
    assert tuned["HOLDFAST_TRUSTED_PROXIES"] == ["10.0.0.0/8", "2001:db8::1"]
    assert tuned["SECURE_PROXY_SSL_HEADER"] == ["HTTP_X_FORWARDED_PROTO", "https"]


def test_with_debug_on_plain_http_works(tmp_path):
    local = _settings_in(tmp_path, DJANGO_DEBUG="true")
    assert local["SECURE_SSL_REDIRECT"] is False
    assert local["SESSION_COOKIE_SECURE"] is False and local["SECURE_HSTS_SECONDS"] == 0


def test_a_proxy_that_is_not_an_address_stops_the_start(tmp_path):
    done = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=_environment(tmp_path, HOLDFAST_TRUSTED_PROXIES="10.0.0.0/8, the-balancer"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "HOLDFAST_TRUSTED_PROXIES must list IP addresses or networks" in done.stderr


@pytest.fixture
def served_over_https(settings):
    # What the production settings above are, in this process's middleware.
    settings.SECURE_SSL_REDIRECT = True
    settings.SECURE_HSTS_SECONDS = 365 * 24 * 3600
    settings.SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    settings.SESSION_COOKIE_SECURE = settings.CSRF_COOKIE_SECURE = True
    return settings


@pytest.mark.django_db
def test_plain_http_is_redirected_but_not_the_probes(client, served_over_https):
    response = client.get("/accounts/login/")
    assert response.status_code == 301
    assert response["Location"] == "https://testserver/accounts/login/"
    assert client.get("/healthz").status_code == 200
    assert client.get("/readyz").status_code in (200, 503)


@pytest.mark.django_db
def test_a_request_a_trusted_proxy_forwarded_over_https_is_secure(client, served_over_https):
    served_over_https.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    response = client.get("/accounts/login/", HTTP_X_FORWARDED_PROTO="https")
    assert response.status_code == 200
    assert response["Strict-Transport-Security"] == "max-age=31536000; includeSubDomains"
    csrf = response.cookies["csrftoken"]
    assert csrf["secure"] and csrf["httponly"]


@pytest.mark.django_db
def test_the_session_cookie_is_secure_and_httponly(
    client, served_over_https, tenant, make_operator
):
    make_operator(tenant, "viewer", username="ann")
    response = client.post(
        "/accounts/login/",
        {"username": "ann", "password": "correct horse battery"},
        secure=True,
    )
    assert response.status_code == 302
    session = response.cookies["sessionid"]
    assert session["secure"] and session["httponly"]


# --- the client's address ---------------------------------------------------------


def _request(remote_addr: str, forwarded: str | None = None):
    extra = {"REMOTE_ADDR": remote_addr}
    if forwarded is not None:
        extra["HTTP_X_FORWARDED_FOR"] = forwarded
    return RequestFactory().get("/", **extra)


@pytest.mark.parametrize(
    ("peer", "forwarded", "client"),
    [
        # A peer that is no trusted proxy: the peer, whatever the header says.
        ("192.0.2.10", "203.0.113.9", "192.0.2.10"),
        # Through the trusted proxy: the address it appended.
        ("10.0.0.5", "203.0.113.9", "203.0.113.9"),
        # Through two: read from the right, past every trusted one.
        ("10.0.0.5", "203.0.113.9, 10.0.0.7", "203.0.113.9"),
        # What the client wrote itself (left of what the proxy appended) is ignored.
        ("10.0.0.5", "198.51.100.66, 203.0.113.9", "203.0.113.9"),
        # A proxy that forwards no header, or garbage: the proxy is all that is known.
        ("10.0.0.5", None, "10.0.0.5"),
        ("10.0.0.5", "unknown", "10.0.0.5"),
        # Ports and IPv6 as proxies write them.
        ("10.0.0.5", "203.0.113.9:51234", "203.0.113.9"),
        ("10.0.0.5", "[2001:db8::9]:443", "2001:db8::9"),
        ("::ffff:10.0.0.5", "203.0.113.9", "203.0.113.9"),
    ],
)
def test_the_client_address_is_read_through_trusted_proxies_only(settings, peer, forwarded, client):
    settings.HOLDFAST_TRUSTED_PROXIES = ["10.0.0.0/8"]
    assert client_address(_request(peer, forwarded)) == client


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("trusted", "recorded"), [(["10.0.0.0/8"], "203.0.113.9"), ([], "10.0.0.5")]
)
def test_the_audit_log_records_the_forwarded_address_only_through_a_trusted_proxy(
    client, settings, tenant, make_operator, trusted, recorded
):
    settings.HOLDFAST_TRUSTED_PROXIES = trusted
    make_operator(tenant, "viewer", username="ann")
    client.post(
        "/accounts/login/",
        {"username": "ann", "password": "wrong"},
        REMOTE_ADDR="10.0.0.5",
        HTTP_X_FORWARDED_FOR="198.51.100.66, 203.0.113.9",
    )
    [entry] = AuditEntry.objects.filter(action="login.failed")
    assert entry.remote_addr == recorded


# --- seeddemo ---------------------------------------------------------------------


@pytest.mark.django_db
def test_seeddemo_refuses_the_published_password_with_debug_off(settings):
    settings.DEBUG = False
    settings.HOLDFAST_DEMO_PASSWORD = ""
    with pytest.raises(CommandError, match="DEBUG is off"):
        call_command("seeddemo", stdout=io.StringIO())
    assert not get_user_model().objects.filter(username__in=["admin", "ann"]).exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("password", "why"),
    [("hf-2026", "too short"), ("password1234", "too common"), ("12345678901234", "numeric")],
)
def test_seeddemo_never_skips_the_password_validators(settings, password, why):
    settings.DEBUG = False
    with pytest.raises(CommandError, match=why):
        call_command("seeddemo", "--password", password, stdout=io.StringIO())
    settings.HOLDFAST_DEMO_PASSWORD = password
    with pytest.raises(CommandError, match=why):
        call_command("seeddemo", stdout=io.StringIO())
    assert not get_user_model().objects.filter(username__in=["admin", "ann"]).exists()


@pytest.mark.django_db(transaction=True, databases="__all__")
def test_seeddemo_with_debug_off_takes_a_given_password_and_never_prints_it(
    settings, tenant, make_operator
):
    settings.DEBUG = False
    # Transactional tests flush the groups the data migration made; make them again.
    make_operator(tenant, "approver", "admin", username="groups-maker")
    password = "a-long-demo-passphrase-" + secrets.token_hex(4)
    out = io.StringIO()
    call_command("seeddemo", "--password", password, stdout=out)
    assert password not in out.getvalue()
    assert "Approver: ann / (the password given)" in out.getvalue()
    for username in ("admin", "ann"):
        assert get_user_model().objects.get(username=username).check_password(password)
