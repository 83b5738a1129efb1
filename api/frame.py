"""The frame every version of the API is built on: ninja, with the API's token
authentication, body limits, error shape and JSON answers."""

from __future__ import annotations

from typing import Any

from ninja import NinjaAPI

from api.auth import TokenAuth
from api.errors import install_handlers
from api.parser import JsonBodyParser


class HoldfastAPI(NinjaAPI):
    """A ``NinjaAPI`` whose operations take bearer tokens (``api.auth``), read bodies
    within ``api.parser``'s limits and answer every error as ``api.errors`` shapes it."""

    def __init__(self, **kwargs: Any):
        super().__init__(auth=TokenAuth(), parser=JsonBodyParser(), **kwargs)
        install_handlers(self)

    def get_content_type(self) -> str:
        # JSON is UTF-8 by definition (RFC 8259, which defines no charset parameter);
        # the same header as every other JSON answer of the site.
        return self.renderer.media_type
