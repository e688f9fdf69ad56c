"""Group-quantized matrices on onnxruntime's `MatMulNBits` kernel, called from torch.

onnxruntime's CPU build ships MLAS block-quantized GEMV/GEMM kernels (4 and 8 bits, blocks of
32, int8 activations under `accuracy_level=4`) that run a batch-1 decode step's linears about
twice as fast as torch's `_weight_int4pack_mm_for_cpu` on the same machine, and take float32
activations, so the step needs no bf16 casts around each linear.

The file's numerics are kept: `MatMulNBits` dequantizes w = (c - z) * s with an integer zero
point z per block, while GGUF's Q4_1 stores w = s * q + m with a float minimum m. We pass the
file's codes c = q and scales s unchanged, z = round(-m / s) (clipped to the code range), and
add the remainder r = m + z * s exactly: per block, sum(x over the block) * r, a (T, K/32) @
(K/32, N) product computed in the same graph. Q8_0 (int8 codes, no offset) maps to uint8 codes
c = q + 128 with z = 128 and no remainder.

Each matrix gets its own inference session (the weights are constant initializers, so MLAS
packs them once at load); the call binds torch's input and output buffers directly (no copies).
Sessions share one onnxruntime thread pool where the runtime allows it, sized to torch's
thread count, with spinning off: spinning workers would take the cores from torch's OpenMP team
between the calls.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from sgl_lite.backend.runner.weights.quant import GROUP, GroupAffine

logger = logging.getLogger("sgl_lite")

# MatMulNBits with int8-quantized activations (MLAS's fastest CPU path).
ACCURACY_INT8 = 4
_CODE_SHIFT = {4: 0, 8: 128}  # GroupAffine codes → the kernel's unsigned codes
_pool_threads: int | None = None  # the size of the shared pool, once made


def available() -> str | None:
    """None when onnxruntime (with its `onnx` graph builder) imports, else why not."""
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError as exc:
        return f"onnxruntime is not installed ({exc.name}); pip install onnxruntime onnx"
    return None


def _session_options(threads: int) -> Any:
    import onnxruntime as ort

    global _pool_threads
    options = ort.SessionOptions()
    options.log_severity_level = 3  # errors only: its warnings go to stderr, not our log
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if _pool_threads is None:
        try:
            # Only possible before this process's first session; one pool for all of them.
            ort.set_global_thread_pool_sizes(threads, 1)
            _pool_threads = threads
        except Exception:  # the runtime's environment exists already: per-session pools
            _pool_threads = 0
    if _pool_threads:
        options.use_per_session_threads = False
    else:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    return options


def _pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """(N, K) unsigned codes → the kernel's (N, K/32, 32*bits/8) bytes, low nibble first."""
    n, k = codes.shape
    if bits == 8:
        return codes.astype(np.uint8).reshape(n, k // GROUP, GROUP)
    pairs = codes.astype(np.uint8).reshape(n, k // 2, 2)
    return (pairs[..., 0] | (pairs[..., 1] << 4)).reshape(n, k // GROUP, GROUP // 2)


def _pack_zero_points(zero: np.ndarray, bits: int) -> np.ndarray:
    """(N, blocks) integer zero points → the kernel's flat bytes (4-bit: two per byte per row)."""
    if bits == 8:
        return zero.astype(np.uint8).reshape(-1)
    n, blocks = zero.shape
    if blocks % 2:
        zero = np.concatenate([zero, np.zeros((n, 1), zero.dtype)], axis=1)
    pairs = zero.astype(np.uint8).reshape(n, -1, 2)
    return (pairs[..., 0] | (pairs[..., 1] << 4)).reshape(-1)


def _graph(w: GroupAffine) -> bytes:
    """The serialized one-node model (plus the remainder product) for matrix `w`."""
    from onnx import TensorProto, helper

    n, k = w.q.shape
    blocks, bits = k // GROUP, w.bits
    scale = w.scale.numpy().astype(np.float32)
    offset = w.offset.numpy().astype(np.float32)
    shift = _CODE_SHIFT[bits]
    top = (1 << bits) - 1
    codes = w.q.numpy().astype(np.int32) + shift
    zero = np.clip(np.round(shift - offset / scale), 0, top)  # (N, blocks)
    remainder = offset + (zero - shift) * scale  # w = (c - z) * s + remainder, exactly

    def const(name: str, array: np.ndarray, kind: int) -> Any:
        return helper.make_tensor(name, kind, array.shape, array.tobytes(), raw=True)

    inits = [
        const("B", _pack_codes(codes, bits), TensorProto.UINT8),
        const("S", scale.reshape(-1), TensorProto.FLOAT),
        const("Z", _pack_zero_points(zero, bits), TensorProto.UINT8),
    ]
    matmul = helper.make_node(
        "MatMulNBits",
        ["A", "B", "S", "Z"],
        ["Y0" if np.any(remainder) else "Y"],
        domain="com.microsoft",
        K=k,
        N=n,
        bits=bits,
        block_size=GROUP,
        accuracy_level=ACCURACY_INT8,
    )
    nodes = [matmul]
    if np.any(remainder):
        inits += [
            const("blocked", np.array([0, blocks, GROUP], np.int64), TensorProto.INT64),
            const("last", np.array([-1], np.int64), TensorProto.INT64),
            const("R", np.ascontiguousarray(remainder.T), TensorProto.FLOAT),  # (blocks, N)
        ]
        nodes += [
            helper.make_node("Reshape", ["A", "blocked"], ["Ab"]),  # (T, blocks, 32)
            helper.make_node("ReduceSum", ["Ab", "last"], ["As"], keepdims=0),  # (T, blocks)
            helper.make_node("MatMul", ["As", "R"], ["Yr"]),  # (T, N)
            helper.make_node("Add", ["Y0", "Yr"], ["Y"]),
        ]
    graph = helper.make_graph(
        nodes,
        "linear",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["T", k])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["T", n])],
        inits,
    )
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets).SerializeToString()


@dataclass(frozen=True)
class OrtNBitsWeight:
    """A (N, K) group-quantized matrix as an onnxruntime session: x (T, K) float32 → (T, N)."""

    session: Any
    shape: tuple[int, int]
    bits: int
    input_dtype = torch.float32  # MLAS quantizes float32 activations to int8 per block itself

    @classmethod
    def from_affine(cls, w: GroupAffine, threads: int) -> OrtNBitsWeight:
        """Builds the session for the file's codes `w` (4- or 8-bit, blocks of 32)."""
        import onnxruntime as ort

        if w.bits not in _CODE_SHIFT:
            raise ValueError(f"MatMulNBits takes 4- or 8-bit codes, got {w.bits}-bit")
        n, k = w.q.shape
        if k % GROUP:
            raise ValueError(f"in_features={k} is not a multiple of {GROUP}")
        session = ort.InferenceSession(
            _graph(w), _session_options(threads), providers=["CPUExecutionProvider"]
        )
        return cls(session, (n, k), w.bits)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x (T, K) float32 → (T, N) float32, computed in place in a new torch tensor."""
        x = x.contiguous()
        rows = x.shape[0]
        out = torch.empty(rows, self.shape[0], dtype=torch.float32)
        binding = self.session.io_binding()
        binding.bind_input("A", "cpu", 0, np.float32, [rows, self.shape[1]], x.data_ptr())
        binding.bind_output("Y", "cpu", 0, np.float32, [rows, self.shape[0]], out.data_ptr())
        self.session.run_with_iobinding(binding)
        return out
