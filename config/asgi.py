import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
# Under daphne each request runs on a thread of its own: a connection a finished
# thread kept would never be used or closed again. The web process connects per
# request (workers and sweepers keep theirs; HOLDFAST_CONN_MAX_AGE still overrides).
os.environ.setdefault("HOLDFAST_CONN_MAX_AGE", "0")
# Django first: the routing below imports models.
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from agentruns.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        # Websockets escape Django's CSRF checks: the origin must be one of ours,
        # and the session must be a logged-in operator (checked in the consumer).
        "websocket": AllowedHostsOriginValidator(
            AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
        ),
    }
)
