"""sgl_lite/frontend."""
