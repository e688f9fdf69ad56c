"""sgl_lite/frontend/backends."""
