"""sgl_lite/backend/models."""
