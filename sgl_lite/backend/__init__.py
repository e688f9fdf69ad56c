"""sgl_lite/backend."""
