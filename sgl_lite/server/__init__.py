"""The HTTP server: SGLang's native API and OpenAI's /v1 API around one in-process Engine."""

from sgl_lite.server.http_server import create_app

__all__ = ["create_app"]
