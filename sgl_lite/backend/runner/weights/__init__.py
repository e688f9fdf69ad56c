"""Weight formats: CPU capability probing, GGUF's quantized tensors, packed int4/int8 linears."""
