"""ONNX models written straight to protobuf bytes, for the few messages our graphs use.

Why not the `onnx` package: importing it costs 1.8-3 s on the 2-core machines we run on (its
`ml_dtypes` extension alone), most of the start-up budget, to build two small graphs whose
weights reach onnxruntime as arrays anyway (`ort_nbits.make_session`). The messages and field
numbers are those of onnx.proto (proto2: repeated scalars unpacked); `tests/unit/
test_onnx_proto.py` checks that the `onnx` package parses our bytes into the same model its own
helpers build.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence

import numpy as np

IR_VERSION = 10  # onnxruntime >= 1.20 reads it
# TensorProto.DataType of the arrays our graphs hold
ELEM_TYPES = {
    np.dtype(np.float32): 1,
    np.dtype(np.uint8): 2,
    np.dtype(np.int8): 3,
    np.dtype(np.int32): 6,
    np.dtype(np.int64): 7,
}
FLOAT = ELEM_TYPES[np.dtype(np.float32)]
_ATTR_FLOAT, _ATTR_INT, _ATTR_INTS = 1, 2, 7  # AttributeProto.AttributeType


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # negative int64s as their two's complement
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _int(field: int, n: int) -> bytes:
    return _varint(field << 3) + _varint(n)


def _bytes(field: int, payload: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload


def _str(field: int, text: str) -> bytes:
    return _bytes(field, text.encode())


def _attribute(name: str, value: int | float | Sequence[int]) -> bytes:
    out = _str(1, name)
    if isinstance(value, float):
        return out + _int(20, _ATTR_FLOAT) + _varint(2 << 3 | 5) + struct.pack("<f", value)
    if isinstance(value, int):
        return out + _int(20, _ATTR_INT) + _int(3, value)
    return out + _int(20, _ATTR_INTS) + b"".join(_int(8, v) for v in value)


def node(
    op_type: str,
    inputs: Iterable[str],
    outputs: Iterable[str],
    domain: str = "",
    **attrs: int | float | Sequence[int],
) -> bytes:
    """A NodeProto."""
    out = b"".join(_str(1, name) for name in inputs)
    out += b"".join(_str(2, name) for name in outputs)
    out += _str(4, op_type)
    out += b"".join(_bytes(5, _attribute(k, v)) for k, v in attrs.items())
    return out + (_str(7, domain) if domain else b"")


def _tensor_header(name: str, array: np.ndarray) -> bytes:
    if array.dtype not in ELEM_TYPES:
        raise TypeError(f"no ONNX element type here for {array.dtype}")
    dims = b"".join(_int(1, d) for d in array.shape)
    return dims + _int(2, ELEM_TYPES[array.dtype]) + _str(8, name)


def tensor(name: str, array: np.ndarray) -> bytes:
    """A TensorProto holding `array`'s bytes (raw_data)."""
    data = np.ascontiguousarray(array).tobytes()  # a 0-d array's bytes are its one value
    return _tensor_header(name, array) + _bytes(9, data)


def external_tensor(
    name: str, array: np.ndarray, location: str = "in-memory", offset: int = 0
) -> bytes:
    """A TensorProto whose data lies outside the model: onnxruntime takes it from the session
    options (`add_external_initializers`), or from `offset` in the file `location`; shape and
    type checked against this header."""
    entries = (("location", location), ("offset", str(offset)), ("length", str(array.nbytes)))
    external = b"".join(_bytes(13, _str(1, k) + _str(2, v)) for k, v in entries)
    return _tensor_header(name, array) + external + _int(14, 1)  # data_location = EXTERNAL


def value_info(name: str, elem_type: int, shape: Sequence[int | str]) -> bytes:
    """A ValueInfoProto for a tensor; a str dimension is symbolic (dim_param)."""
    dims = b"".join(_bytes(1, _str(2, d) if isinstance(d, str) else _int(1, d)) for d in shape)
    tensor_type = _int(1, elem_type) + _bytes(2, dims)
    return _str(1, name) + _bytes(2, _bytes(1, tensor_type))


def model(
    nodes: Sequence[bytes],
    inputs: Sequence[bytes],
    outputs: Sequence[bytes],
    initializers: Sequence[bytes],
    opsets: Iterable[tuple[str, int]],
    name: str = "graph",
) -> bytes:
    """A serialized ModelProto of one graph."""
    graph = b"".join(_bytes(1, n) for n in nodes) + _str(2, name)
    graph += b"".join(_bytes(5, t) for t in initializers)
    graph += b"".join(_bytes(11, v) for v in inputs)
    graph += b"".join(_bytes(12, v) for v in outputs)
    imports = b"".join(_bytes(8, _str(1, d) + _int(2, v)) for d, v in opsets)
    return _int(1, IR_VERSION) + imports + _bytes(7, graph)
