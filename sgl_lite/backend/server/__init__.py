"""sgl_lite/backend/server."""
