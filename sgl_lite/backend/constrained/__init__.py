"""sgl_lite/backend/constrained."""
