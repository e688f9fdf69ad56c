"""sgl_lite/frontend/backends: where programs meet models (engine, HTTP, OpenAI).

Each backend module imports its heavy dependency (torch, requests, openai) only when used.
"""

from sgl_lite.frontend.backends.base import Backend, GenRequest, GenResult, Prompt

__all__ = ["Backend", "GenRequest", "GenResult", "Prompt"]
