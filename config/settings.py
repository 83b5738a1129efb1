"""Holdfast settings: one module, every difference between environments from the environment."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from config.env import (
    env_bool,
    env_float,
    env_int,
    env_list,
    env_networks,
    env_str,
    postgres_from_url,
)

BASE_DIR = Path(__file__).resolve().parent.parent
# The SQLite files, STATIC_ROOT and the generated secret key live here. Importing
# settings writes nothing: `make setup` creates the directory and the key (a test
# run, its own: tests/environment.py).
VAR_DIR = Path(env_str("HOLDFAST_VAR_DIR", str(BASE_DIR / "var")))

DEBUG = env_bool("DJANGO_DEBUG", False)
SECRET_KEY = env_str("DJANGO_SECRET_KEY", "")
if not SECRET_KEY:
    if not DEBUG and env_bool("HOLDFAST_REQUIRE_SECRET_KEY", False):
        raise ImproperlyConfigured("DJANGO_SECRET_KEY must be set")
    # The embedded default reads the key `make setup` generated into var/, so
    # sessions and signed tasks survive restarts.
    key_file = VAR_DIR / "secret_key"
    if not key_file.exists():
        raise ImproperlyConfigured(
            "No secret key: set DJANGO_SECRET_KEY (or DJANGO_SECRET_KEY_FILE), "
            f"or run `make setup` to generate {key_file}"
        )
    SECRET_KEY = key_file.read_text().strip()

ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", ["127.0.0.1", "localhost"])
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_htmx",
    "template_partials",
    "django_q",
    "channels",
    # The API's framework: its templates and static files serve /api/v1/docs locally.
    "ninja",
    # Before the apps: its login signal receivers run before the audit's (config/wiring.py).
    "axes",
    "accounts",
    "agentruns",
    "approvals",
    "reconciliation",
    "evidence",
    "retention",
    "bulk",
    "notifications",
    "webhooks",
    "api",
    "support",
    "sandbox",
    # The composition root: wires the apps above together (config/wiring.py).
    "config.apps.HoldfastConfig",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Serves static files under daphne, which serves none itself.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "accounts.middleware.OperatorTimezoneMiddleware",
    # Last, as django-axes asks: turns a locked-out login into the page that explains it.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "config.urls"
ASGI_APPLICATION = "config.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "accounts.context_processors.attention",
                "accounts.context_processors.time_zone_unchosen",
            ],
        },
    },
]

# --- Databases ---------------------------------------------------------------
# SQLite is the embedded default. WAL lets readers run beside the one writer;
# IMMEDIATE transactions take the write lock at BEGIN so a read-then-write never
# fails with "database is locked" without waiting; the busy timeout stays far
# below the run lease so a writer that waits still has a lease when it gets in.
SQLITE_BUSY_TIMEOUT = env_float("HOLDFAST_SQLITE_BUSY_TIMEOUT", 1.0)


def _sqlite(path: Path, test_path: Path) -> dict:
    return {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": path,
        "OPTIONS": {
            "timeout": SQLITE_BUSY_TIMEOUT,
            "transaction_mode": "IMMEDIATE",
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;",
        },
        "TEST": {"NAME": test_path},
    }


DATABASE_URL = env_str("DATABASE_URL", "")
if DATABASE_URL:
    DATABASES = {"default": postgres_from_url(DATABASE_URL)}
    DATABASES["default"]["CONN_MAX_AGE"] = env_int("HOLDFAST_CONN_MAX_AGE", 60)
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
    # Behind PgBouncer in transaction pooling: a server-side cursor (QuerySet.iterator())
    # cannot outlive the transaction its server connection was lent for (docs/scaling.md).
    DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = env_bool(
        "HOLDFAST_DISABLE_SERVER_SIDE_CURSORS", False
    )
    Q_ORM_ALIAS = "default"
else:
    sqlite_path = Path(env_str("HOLDFAST_SQLITE_PATH", str(VAR_DIR / "holdfast.sqlite3")))
    DATABASES = {
        "default": _sqlite(sqlite_path, VAR_DIR / "test-holdfast.sqlite3"),
        # django-q2's queue lives in its own file so its pusher and monitor never
        # take the write lock the engine's step commits need.
        "queue": _sqlite(
            sqlite_path.with_name(sqlite_path.stem + "-queue.sqlite3"),
            VAR_DIR / "test-holdfast-queue.sqlite3",
        ),
    }
    Q_ORM_ALIAS = "queue"
# The sandbox stands for the outside world: its records are the provider's own,
# so they live in a database of their own (SQLite file by default).
SANDBOX_DATABASE_URL = env_str("SANDBOX_DATABASE_URL", "")
if SANDBOX_DATABASE_URL:
    DATABASES["sandbox"] = postgres_from_url(SANDBOX_DATABASE_URL)
else:
    DATABASES["sandbox"] = _sqlite(
        Path(env_str("HOLDFAST_SANDBOX_SQLITE_PATH", str(VAR_DIR / "sandbox.sqlite3"))),
        VAR_DIR / "test-sandbox.sqlite3",
    )
DATABASE_ROUTERS = ["config.routers.QueueRouter", "config.routers.SandboxRouter"]

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
# Created by `make setup`: WhiteNoise warns when it is missing, even while it serves
# from the finders.
STATIC_ROOT = VAR_DIR / "static"
# The embedded default serves static files straight from the apps, with no
# collectstatic step; a deployment runs collectstatic and sets this to false.
WHITENOISE_USE_FINDERS = env_bool("HOLDFAST_STATIC_FROM_FINDERS", True)
MEDIA_ROOT = Path(env_str("HOLDFAST_MEDIA_ROOT", str(VAR_DIR / "media")))
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "/runs/"
LOGOUT_REDIRECT_URL = "login"

# --- Logins: throttling and lockout (django-axes) ------------------------------
# Both login pages (/accounts/login/ and /admin/login/) go through authenticate(),
# where axes refuses a username and address pair that failed too often, before
# the password is even checked. Per pair, so someone guessing at one login from
# one place neither locks its owner out elsewhere nor the office they share.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = env_int("HOLDFAST_LOGIN_FAILURE_LIMIT", 5)
AXES_COOLOFF_TIME = timedelta(seconds=env_int("HOLDFAST_LOGIN_LOCKOUT_SECONDS", 15 * 60))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
# A lockout ends when the page says it does: attempts while locked out do not
# start the wait again.
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_CLIENT_IP_CALLABLE = "accounts.client_address.client_address"
AXES_LOCKOUT_CALLABLE = "accounts.logins.lockout_response"
# The audit log records every failure and lockout (accounts/logins.py); axes keeps
# only the counts it needs, not a second log of every login.
AXES_DISABLE_ACCESS_LOG = True
# Its admin pages would lift lockouts unaudited; `manage.py axes_reset_username`.
AXES_ENABLE_ADMIN = False
AXES_VERBOSE = False

# --- HTTPS, cookies and proxies --------------------------------------------------
# With DEBUG off (the default) Holdfast assumes it is served over HTTPS: cookies
# only over HTTPS, HSTS, and plain HTTP redirected. A deployment whose TLS ends at a
# load balancer names it in HOLDFAST_TRUSTED_PROXIES; one whose health checker
# speaks plain HTTP to the web process may turn the redirect off (the probes are
# never redirected anyway).
SESSION_COOKIE_SECURE = env_bool("HOLDFAST_SECURE_COOKIES", not DEBUG)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
SESSION_COOKIE_HTTPONLY = True
# No script reads the CSRF cookie: pages send the token from the page itself
# (base.html's hx-headers for htmx, {% csrf_token %} in every form).
CSRF_COOKIE_HTTPONLY = True
SECURE_HSTS_SECONDS = env_int("HOLDFAST_HSTS_SECONDS", 0 if DEBUG else 365 * 24 * 3600)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("HOLDFAST_HSTS_INCLUDE_SUBDOMAINS", True)
SECURE_HSTS_PRELOAD = env_bool("HOLDFAST_HSTS_PRELOAD", False)
SECURE_SSL_REDIRECT = env_bool("HOLDFAST_SSL_REDIRECT", not DEBUG)
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$"]
# Load balancers and reverse proxies in front of the web process (addresses or
# networks). Through them the audit log and the login lockout see the client's
# address from X-Forwarded-For (accounts/client_address.py), and a request they
# forwarded with `X-Forwarded-Proto: https` is a secure one.
HOLDFAST_TRUSTED_PROXIES = env_networks("HOLDFAST_TRUSTED_PROXIES")
if HOLDFAST_TRUSTED_PROXIES:
    _proto_header = env_str("HOLDFAST_PROXY_SSL_HEADER", "X-Forwarded-Proto")
    SECURE_PROXY_SSL_HEADER = ("HTTP_" + _proto_header.upper().replace("-", "_"), "https")
SILENCED_SYSTEM_CHECKS = []
if not SECURE_HSTS_PRELOAD:
    # security.W021 asks for HSTS preloading. Submitting a domain to the browsers'
    # preload list is its owner's decision and hard to undo, so it stays off unless
    # HOLDFAST_HSTS_PRELOAD=true says it was made.
    SILENCED_SYSTEM_CHECKS.append("security.W021")

# --- Channels ----------------------------------------------------------------
REDIS_URL = env_str("REDIS_URL", "")
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL]},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# --- Workers (django-q2) -----------------------------------------------------
# django-q2 only wakes runs; leases in the Run table decide who runs. A task is
# acknowledged even when it fails (the engine owns retries), its timeout stays
# below the broker's redelivery interval, and the prefetch queue stays small so
# a prefetched task never waits long enough to be redelivered.
HOLDFAST_TASK_TIMEOUT = env_int("HOLDFAST_TASK_TIMEOUT", 60)
Q_CLUSTER = {
    "name": "holdfast",
    "workers": env_int("HOLDFAST_WORKERS", 2),
    "recycle": env_int("HOLDFAST_Q_RECYCLE", 500),
    "timeout": HOLDFAST_TASK_TIMEOUT,
    "retry": HOLDFAST_TASK_TIMEOUT + 30,
    "max_attempts": 1,
    "ack_failures": True,
    # A finished task's row says nothing the run's own events do not (the run is the
    # record); keeping the last N successes cost the monitor a row lock on each of
    # them, an insert and a delete per task. -1: successes are not kept, failures are.
    "save_limit": env_int("HOLDFAST_Q_SAVE_LIMIT", -1),
    "queue_limit": env_int("HOLDFAST_WORKERS", 2),
    "catch_up": False,
    # The ORM broker, woken by NOTIFY on PostgreSQL (agentruns/broker.py); on SQLite it
    # polls the queue every `poll` seconds.
    "broker_class": "agentruns.broker.ListeningORM",
    "poll": 0.1,
    "orm": Q_ORM_ALIAS,
    "label": "Workers",
}

# --- Engine ------------------------------------------------------------------
HOLDFAST = {
    # Modules whose import registers agents.
    "AGENT_MODULES": env_list(
        "HOLDFAST_AGENT_MODULES",
        [
            "examples.agents",
            "support.agents",
            "support.pydantic_agent",
            "notifications.agents",
            "webhooks.agents",
        ],
    ),
    # A lease is short so a dead worker's run is recovered within seconds; a live
    # worker renews it between steps and while a call is within its timeout.
    "LEASE_SECONDS": env_float("HOLDFAST_LEASE_SECONDS", 3.0),
    # An effect is sent only while the lease outlives this budget (DESIGN §12.1).
    "SEND_BUDGET_SECONDS": env_float("HOLDFAST_SEND_BUDGET_SECONDS", 30.0),
    # How long one task advances a run before handing it back to the queue.
    "TIME_SLICE_SECONDS": env_float("HOLDFAST_TIME_SLICE_SECONDS", HOLDFAST_TASK_TIMEOUT / 2),
    # Claims without progress before a run is blocked as a crash loop (DESIGN §12.4).
    "MAX_CLAIMS_WITHOUT_PROGRESS": env_int("HOLDFAST_MAX_CLAIMS_WITHOUT_PROGRESS", 5),
    # A queued run nobody claimed in this long is enqueued again.
    "REQUEUE_AFTER_SECONDS": env_float("HOLDFAST_REQUEUE_AFTER_SECONDS", 15.0),
    # The sweeper never wakes one run twice within django-q2's redelivery interval.
    "REDELIVERY_SECONDS": float(Q_CLUSTER["retry"]),
    "SWEEP_INTERVAL_SECONDS": env_float("HOLDFAST_SWEEP_INTERVAL_SECONDS", 0.5),
    # Automatic reconciliation lookups in flight at once, for the whole deployment
    # (counted in the database, not per process): each holds a worker for up to its
    # 5 s timeout, so keep it below the number of worker processes.
    "LOOKUP_CONCURRENCY": env_int("HOLDFAST_LOOKUP_CONCURRENCY", 4),
    # Retention (docs/architecture.md §3.14): the sweeper's retention pass runs this often,
    # and redacts, then archives, at most this many runs each, one transaction per run.
    "RETENTION_INTERVAL_SECONDS": env_float("HOLDFAST_RETENTION_INTERVAL_SECONDS", 60.0),
    "RETENTION_BATCH_RUNS": env_int("HOLDFAST_RETENTION_BATCH_RUNS", 200),
    # Step results larger than this go to Blob storage.
    "INLINE_RESULT_LIMIT": env_int("HOLDFAST_INLINE_RESULT_LIMIT", 256 * 1024),
    # While the database connection is lost (a restart, a failover), a worker retries
    # its writes this long, the sweeper and the live pages until it is back.
    "RECONNECT_SECONDS": env_float("HOLDFAST_RECONNECT_SECONDS", 15.0),
    # PostgreSQL: the engine prepares its statements on the server, once per
    # connection. Turn off behind a pooler in transaction mode that cannot keep them
    # (PgBouncer before 1.21, or max_prepared_statements = 0): docs/scaling.md.
    "PREPARED_STATEMENTS": env_bool("HOLDFAST_PREPARED_STATEMENTS", True),
    # On SIGTERM a worker finishes its current step (or abandons a call still in
    # flight) and releases its run within this many seconds: less than honcho's 5 s
    # and systemd's 90 s before they kill.
    "SHUTDOWN_GRACE_SECONDS": env_float("HOLDFAST_SHUTDOWN_GRACE_SECONDS", 4.0),
}

# --- The sandbox and the adapters that talk to it -----------------------------
SANDBOX_HOST = env_str("SANDBOX_HOST", "127.0.0.1")
SANDBOX_PORT = env_int("SANDBOX_PORT", 12111)
SANDBOX_SMTP_PORT = env_int("SANDBOX_SMTP_PORT", 12125)
SANDBOX_URL = env_str("SANDBOX_URL", f"http://{SANDBOX_HOST}:{SANDBOX_PORT}")
# Stripe keeps idempotency keys at least 24 hours.
SANDBOX_IDEMPOTENCY_TTL_SECONDS = env_int("SANDBOX_IDEMPOTENCY_TTL_SECONDS", 24 * 3600)
# The token the sandbox's control routes (/_sandbox/...) ask for; empty: runsandbox
# makes one and writes it to VAR_DIR/sandbox-token (sandbox.control).
SANDBOX_CONTROL_TOKEN = env_str("SANDBOX_CONTROL_TOKEN", "")

# Payments: the sandbox by default; Stripe's test mode is
# PAYMENTS_API_BASE=https://api.stripe.com PAYMENTS_API_KEY=sk_test_...
PAYMENTS_API_BASE = env_str("PAYMENTS_API_BASE", SANDBOX_URL)
PAYMENTS_API_KEY = env_str("PAYMENTS_API_KEY", "sk_test_sandbox")
PAYMENTS_TIMEOUT_SECONDS = env_float("PAYMENTS_TIMEOUT_SECONDS", 10.0)
SHOP_API_BASE = env_str("SHOP_API_BASE", SANDBOX_URL)
SHOP_API_KEY = env_str("SHOP_API_KEY", "sk_test_sandbox")
EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
EMAIL_HOST = env_str("EMAIL_HOST", SANDBOX_HOST)
EMAIL_PORT = env_int("EMAIL_PORT", SANDBOX_SMTP_PORT)
EMAIL_TIMEOUT = env_int("EMAIL_TIMEOUT", 10)
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "support@holdfast.example")

# The deployment's own provider accounts, for the default tenant only (every other
# tenant acts with its own: accounts.provider_accounts). For each provider a tool
# names, the settings that hold its endpoint, secret and sender.
HOLDFAST_PROVIDER_DEFAULTS = {
    "payments": {"endpoint": "PAYMENTS_API_BASE", "secret": "PAYMENTS_API_KEY"},
    "shop": {"endpoint": "SHOP_API_BASE", "secret": "SHOP_API_KEY"},
    "mail": {"sender": "DEFAULT_FROM_EMAIL"},
    "webhook": {"endpoint": "HOLDFAST_WEBHOOK_URL"},
}
# The default tenant's chat webhook (Slack-compatible) for notifications; none when blank.
HOLDFAST_WEBHOOK_URL = env_str("HOLDFAST_WEBHOOK_URL", "")
# Where the links in notifications point: the dashboard's address as people reach it.
HOLDFAST_BASE_URL = env_str("HOLDFAST_BASE_URL", "http://127.0.0.1:8000")
# How long one webhook attempt waits for the endpoint's answer (at most the tool's 15 s).
HOLDFAST_WEBHOOK_TIMEOUT_SECONDS = env_float("HOLDFAST_WEBHOOK_TIMEOUT_SECONDS", 10.0)
# Whether a tenant's webhook endpoint may be a loopback or private address (webhooks.addresses):
# for local development and tests against the sandbox only.
HOLDFAST_WEBHOOK_ALLOW_PRIVATE = env_bool("HOLDFAST_WEBHOOK_ALLOW_PRIVATE", False)
# How long an operator's digest period is: one digest email per period that held notices.
HOLDFAST_DIGEST_SECONDS = env_int("HOLDFAST_DIGEST_SECONDS", 3600)
# Where a tenant's ``file:<name>`` secret references are read from.
HOLDFAST_SECRETS_DIR = Path(env_str("HOLDFAST_SECRETS_DIR", str(VAR_DIR / "secrets")))

# --- Model providers ---------------------------------------------------------
OPENAI_BASE_URL = env_str("OPENAI_BASE_URL", "https://api.openai.com/v1")
OPENAI_API_KEY = env_str("OPENAI_API_KEY", "")
OPENAI_MODEL = env_str("OPENAI_MODEL", "gpt-4o-mini")
OPENAI_TIMEOUT_SECONDS = env_float("OPENAI_TIMEOUT_SECONDS", 20.0)

# --- Operations: health, metrics, logs ------------------------------------------
# Every database read of /readyz and of /metrics' aggregates answers within this
# (a statement timeout on PostgreSQL, a deadline for the answer everywhere).
HOLDFAST_PROBE_TIMEOUT_SECONDS = env_float("HOLDFAST_PROBE_TIMEOUT_SECONDS", 2.0)
# /readyz: the sweeper's lease may have expired this long ago (one sweeper handing
# over to another) before the deployment is not ready.
HOLDFAST_READY_SWEEPER_GRACE_SECONDS = env_float("HOLDFAST_READY_SWEEPER_GRACE_SECONDS", 5.0)
# /readyz: the longest a due run may wait for a worker.
HOLDFAST_READY_QUEUE_LAG_SECONDS = env_float("HOLDFAST_READY_QUEUE_LAG_SECONDS", 60.0)
# /metrics asks for `Authorization: Bearer <token>` when this is set.
HOLDFAST_METRICS_TOKEN = env_str("HOLDFAST_METRICS_TOKEN", "")
# Live pages: open sockets one login may hold in one web process (a page opens one).
HOLDFAST_MAX_SOCKETS_PER_USER = env_int("HOLDFAST_MAX_SOCKETS_PER_USER", 20)
# Live pages: each web process has one follower that reads a watched tenant's logs
# for all its sockets. On PostgreSQL it is told of each commit (LISTEN/NOTIFY) and
# reads every tenant again this often in case a notification was missed; on SQLite
# it reads every watched tenant this often.
HOLDFAST_LIVE_REREAD_SECONDS = env_float("HOLDFAST_LIVE_REREAD_SECONDS", 5.0)
HOLDFAST_LIVE_POLL_SECONDS = env_float("HOLDFAST_LIVE_POLL_SECONDS", 0.5)
# PostgreSQL: how long a process gathers the runs its engine committed before one
# NOTIFY per tenant tells the live pages (agentruns/doorbell.py).
HOLDFAST_LIVE_NOTIFY_SECONDS = env_float("HOLDFAST_LIVE_NOTIFY_SECONDS", 0.02)
# PostgreSQL: a worker cluster's pusher is woken by each enqueue's NOTIFY and looks at
# the queue this often without one (a lapsed task's lock, a notification missed while
# its listener reconnected): agentruns/broker.py.
HOLDFAST_QUEUE_REREAD_SECONDS = env_float("HOLDFAST_QUEUE_REREAD_SECONDS", 1.0)
# Where each process writes its metrics for the host's scrape to add up. Exported:
# prometheus_client picks its multiprocess mode from the environment when it is
# first imported, which django-q2 does while the apps load.
PROMETHEUS_MULTIPROC_DIR = env_str("PROMETHEUS_MULTIPROC_DIR", str(VAR_DIR / "prometheus"))
os.environ["PROMETHEUS_MULTIPROC_DIR"] = PROMETHEUS_MULTIPROC_DIR

# "json": one JSON object a line, with the run, step and effect key (config/logging.py).
HOLDFAST_LOG_FORMAT = env_str("HOLDFAST_LOG_FORMAT", "plain")
if HOLDFAST_LOG_FORMAT not in ("plain", "json"):
    raise ImproperlyConfigured(
        f"HOLDFAST_LOG_FORMAT must be 'plain' or 'json', not {HOLDFAST_LOG_FORMAT!r}"
    )
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        "json": {"()": "config.logging.JsonFormatter"},
    },
    "filters": {
        "run_context": {"()": "config.logging.RunContextFilter"},
        "task_chatter": {"()": "config.logging.TaskChatterFilter"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": HOLDFAST_LOG_FORMAT,
            "filters": ["run_context"],
        }
    },
    "root": {"handlers": ["console"], "level": env_str("HOLDFAST_LOG_LEVEL", "INFO")},
    "loggers": {"django-q": {"filters": ["task_chatter"]}},
}

# The password seeddemo gives the demo logins it creates. Unset: with DEBUG on the
# published demo password; with DEBUG off seeddemo refuses (`make run` sets it).
HOLDFAST_DEMO_PASSWORD = env_str("HOLDFAST_DEMO_PASSWORD", "")
