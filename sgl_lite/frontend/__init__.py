"""sgl_lite/frontend: SGLang's frontend language (IR, interpreter, backends). No tensors here."""
