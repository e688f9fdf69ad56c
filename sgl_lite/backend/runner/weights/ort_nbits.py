"""Group-quantized matrices on onnxruntime's `MatMulNBits` kernel, called from torch.

onnxruntime's CPU build ships MLAS block-quantized GEMV/GEMM kernels (4 and 8 bits, blocks of
16 to 256, int8 activations under `accuracy_level=4`) that run a batch-1 decode step's linears about
twice as fast as torch's `_weight_int4pack_mm_for_cpu` on the same machine, and take float32
activations, so the step needs no bf16 casts around each linear.

The file's numerics are kept: `MatMulNBits` dequantizes w = (c - z) * s with an integer zero
point z per block, while GGUF's Q4_1 stores w = s * q + m with a float minimum m. We pass the
file's codes c = q and scales s unchanged, z = round(-m / s) (clipped to the code range), and
add the remainder r = m + z * s exactly: per block, sum(x over the block) * r, a (T, K/g) @
(K/g, N) product computed in the same graph. Q8_0 (int8 codes, no offset) maps to uint8 codes
c = q + 128 with z = 128 and no remainder; so do the 5- and 6-bit formats' codes, held as 8-bit
(gguf_blocks), Q6_K's in blocks of 16.

Each matrix gets its own inference session (the weights are constant initializers, so MLAS
packs them once at load); the call binds torch's input and output buffers directly (no copies).
Sessions share one onnxruntime thread pool where the runtime allows it, sized to torch's
thread count, with spinning off: spinning workers would take the cores from torch's OpenMP team
between the calls.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sgl_lite.backend.runner.weights import onnx_proto
from sgl_lite.backend.runner.weights.quant import GroupAffine

logger = logging.getLogger("sgl_lite")

# MatMulNBits' `accuracy_level`: 4 quantizes the activations to int8 per block (MLAS's fastest
# CPU path), 0 keeps them float32 (much slower, and only for 4-bit codes: MLAS has no float32
# kernel for 8-bit ones, its fallback took 48 ms for an 8192 x 2048 matrix at batch 1 against
# 0.3 ms, measured).
ACCURACY_INT8 = 4
ACCURACY_FLOAT32 = 0
# The level every linear is built at: int8 activations, as llama.cpp's kernels quantize them
# for these files. The 4-bit q/k/v once took float32 ones, which cost the embedded model's
# batch-1 graph step 14.0 -> 10.5 ms (2.6x on the projection, at the same bytes) and bought no
# accuracy: on the fixed test prompt both agree with float32's top-1 on all 62 decided tokens
# (63/64 in all), and the perplexity of the fixed text is within 0.08 % of float32's with int8
# activations there, 0.69 % with float32 ones (decode steps, 1 and 8 rows; 64-row int passes).
ACCURACY = ACCURACY_INT8
_CODE_SHIFT = {4: 0, 8: 128}  # GroupAffine codes → the kernel's unsigned codes
_pool_threads: int | None = None  # the size of the shared pool, once made


def available() -> str | None:
    """None when onnxruntime imports, else why not."""
    try:
        import onnxruntime  # noqa: F401
    except ImportError as exc:
        return f"onnxruntime is not installed ({exc.name}); pip install onnxruntime"
    return None


def session_options(threads: int) -> Any:
    """Options for a session on this process's shared pool of `threads` (spinning off)."""
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


def _pack_codes(codes: torch.Tensor, bits: int, group: int) -> np.ndarray:
    """(N, K) uint8 unsigned codes → the kernel's (N, K/group, group*bits/8) bytes, low nibble
    first. On torch: its strided element-wise loops beat numpy's several-fold on these pairs."""
    n, k = codes.shape
    if bits == 8:
        return codes.contiguous().numpy().reshape(n, k // group, group)
    pairs = codes.reshape(n, k // 2, 2)
    # One fresh (N, K/2) tensor, the low nibbles OR-ed into it in place: a second full-size
    # temporary costs its page faults in a load, more than its arithmetic.
    packed = pairs[..., 1] << 4
    packed |= pairs[..., 0]
    return packed.numpy().reshape(n, k // group, group // 2)


def _pack_zero_points(zero: np.ndarray, bits: int) -> np.ndarray:
    """(N, blocks) integer zero points → the kernel's flat bytes (4-bit: two per byte per row)."""
    if bits == 8:
        return zero.astype(np.uint8).reshape(-1)
    n, blocks = zero.shape
    if blocks % 2:
        zero = np.concatenate([zero, np.zeros((n, 1), zero.dtype)], axis=1)
    pairs = zero.astype(np.uint8).reshape(n, -1, 2)
    return (pairs[..., 0] | (pairs[..., 1] << 4)).reshape(-1)


def linear_nodes(
    w: GroupAffine, x: str, y: str, prefix: str = ""
) -> tuple[list[bytes], dict[str, np.ndarray]]:
    """The nodes and constants (by name) computing y = x @ w^T for matrix `w` on `MatMulNBits`
    (plus the remainder product, where the file's minimum is not an integer zero point),
    x (T, K) float32 → y (T, N); every name but `x` and `y` starts with `prefix`. The kernel
    runs at `ACCURACY`, read at each call."""
    n, k = w.q.shape
    blocks, bits = k // w.group, w.bits
    scale = np.asarray(w.scale.numpy(), dtype=np.float32)
    offset = np.asarray(w.offset.numpy(), dtype=np.float32)
    shift = _CODE_SHIFT[bits]
    top = (1 << bits) - 1
    # 4-bit codes are unsigned already; 8-bit ones shift into the kernel's unsigned range
    # (int8 q + 128 as uint8 is q's bits with the top one flipped).
    codes = w.q.view(torch.uint8)
    codes = codes if bits == 4 else torch.bitwise_xor(codes, 0x80)
    # A block whose scale is 0 (real files have them: an all-zero block) is its offset alone:
    # zero point `shift`, so (c - z) * s is 0 and the remainder is the offset, not 0/0 = NaN.
    live = scale != 0
    ratio = np.divide(offset, scale, out=np.zeros_like(offset), where=live)
    zero = np.clip(np.round(shift - ratio), 0, top)  # (N, blocks)
    remainder = offset + (zero - shift) * scale  # w = (c - z) * s + remainder, exactly
    p = prefix
    consts = {
        p + "B": _pack_codes(codes, bits, w.group),
        p + "S": scale.reshape(-1),
        p + "Z": _pack_zero_points(zero, bits),
    }
    exact = not np.any(remainder)
    matmul = onnx_proto.node(
        "MatMulNBits",
        [x, p + "B", p + "S", p + "Z"],
        [y if exact else p + "Y0"],
        domain="com.microsoft",
        K=k,
        N=n,
        bits=bits,
        block_size=w.group,
        accuracy_level=ACCURACY,
    )
    nodes = [matmul]
    if not exact:
        consts[p + "blocked"] = np.array([0, blocks, w.group], np.int64)
        consts[p + "last"] = np.array([-1], np.int64)
        consts[p + "R"] = np.ascontiguousarray(remainder.T)  # (blocks, N)
        nodes += [
            onnx_proto.node("Reshape", [x, p + "blocked"], [p + "Ab"]),  # (T, blocks, 32)
            onnx_proto.node("ReduceSum", [p + "Ab", p + "last"], [p + "As"], keepdims=0),
            onnx_proto.node("MatMul", [p + "As", p + "R"], [p + "Yr"]),  # (T, N)
            onnx_proto.node("Add", [p + "Y0", p + "Yr"], [y]),
        ]
    return nodes, consts


OPSETS = (("", 21), ("com.microsoft", 1))  # the ONNX opset and onnxruntime's contrib ops
# Constants this large reach onnxruntime as arrays, not inside the serialized model: copying
# ~100 MB of weights through protobuf (graph, model, bytes, then onnxruntime's parse) took
# seconds of a start-up. Smaller ones (shapes, axes) stay inline, where shape inference sees them.
EXTERNAL_BYTES = 1024
# Where the matrices onnxruntime repacks (`prepacked`) total this much, every large constant
# reaches it through scratch files instead, and ours are dropped before the session is made.
# onnxruntime copies arrays handed to it and frees its copy only once repacked, so ours, its
# copy and its packed layout were alive together: a 1B Q4_K_M model's load peaked at 3.1 GB
# against 1.8 GB after it (1.9 GB through the files, measured). Files it maps, and unmaps each
# matrix once repacked. Below the bound (the embedded model's step, 110 MB; one linear's
# session) the peak is elsewhere, and a load writes nothing to disk.
FILE_BYTES = 128 << 20
_FILE_ALIGN = 1 << 16  # each constant's offset in a file: onnxruntime maps page-aligned data
# The repacked matrices, unmapped once the session exists (their file's disk space freed with
# them); the rest (scales, zero points, norms, RoPE tables: ~190 MB for the 1B model) stay
# mapped, their unlinked file's disk space taken, for the session's life.
_PACKED_FILE, _KEPT_FILE = "packed.bin", "kept.bin"
SHARED_MEMORY = Path("/dev/shm")  # where the files go when it has room (`_scratch_root`)
_PACKED_KEYS = ("B", "R")  # the names' last parts (`linear_nodes`) of the matrices repacked


def prepacked(name: str) -> bool:
    """Whether the constant `name` (as `linear_nodes` names it) is a matrix onnxruntime repacks
    into its own layout when the session is made (`MatMulNBits`' codes, `MatMul`'s remainder),
    then drops; the scales and zero points it keeps as given."""
    return name.rsplit(".", 1)[-1] in _PACKED_KEYS


def _filed(consts: dict[str, np.ndarray], names: list[str], path: Path) -> list[bytes]:
    """Writes the named constants into the file `path`, each at an aligned offset (holes
    between them); returns their TensorProtos pointing there. Raises OSError."""
    headers = []
    with open(path, "wb") as file:
        for name in names:
            array = np.ascontiguousarray(consts[name])
            offset = file.tell()
            file.write(array.reshape(-1).view(np.uint8).data)
            headers.append(onnx_proto.external_tensor(name, array, path.name, offset))
            file.seek(-file.tell() % _FILE_ALIGN, os.SEEK_CUR)
    return headers


def _scratch_root(size: int) -> Path:
    """Where the constants' scratch folder goes: the shared-memory file system (/dev/shm) where
    it has room for `size` bytes with as much to spare, else our cache folder on disk.

    Writing new files on disk cost ~2.6 s per GB here (ext4 allocating blocks for them), ~5x the
    same write into memory; the files live only while the session is made, then are unmapped and
    freed, so disk buys nothing. Containers often give /dev/shm only 64 MB: then the disk.
    """
    with contextlib.suppress(OSError):
        if os.access(SHARED_MEMORY, os.W_OK) and shutil.disk_usage(SHARED_MEMORY).free >= 2 * size:
            return SHARED_MEMORY
    from sgl_lite.backend.runner.model_loader import cache_dir  # it imports the weights' modules

    return cache_dir()


def _file_constants(
    consts: dict[str, np.ndarray], large: list[str], options: Any, stack: contextlib.ExitStack
) -> list[bytes] | None:
    """The `large` constants written to scratch files (removed when `stack` closes) and taken
    out of `consts`, `options` pointed at them; their TensorProtos, or None (nothing changed)
    where the files cannot be written."""
    packed = [name for name in large if prepacked(name)]
    try:
        root = _scratch_root(sum(consts[name].nbytes for name in large))
        root.mkdir(parents=True, exist_ok=True)
        _sweep_orphans(root)
        scratch = tempfile.TemporaryDirectory(
            prefix=f"ort-{os.getpid()}-", dir=root, ignore_cleanup_errors=True
        )
        folder = Path(stack.enter_context(scratch))
        headers = _filed(consts, packed, folder / _PACKED_FILE)
        headers += _filed(consts, [n for n in large if n not in packed], folder / _KEPT_FILE)
    except OSError as exc:
        logger.info("sgl_lite weights: constants handed to onnxruntime in memory (%s)", exc)
        return None
    options.add_session_config_entry(
        "session.model_external_initializers_file_folder_path", str(folder)
    )
    for name in large:  # onnxruntime reads them from the files now
        del consts[name]
    return headers


def _sweep_orphans(root: Path) -> None:
    """Removes the scratch folders of loads whose process is gone (killed while its session
    was made: ~1 GB each for a 1B model); another live process's folder is left alone."""
    for folder in root.glob("ort-*-*"):
        pid = folder.name.split("-")[1]
        if not pid.isdigit() or _alive(int(pid)):
            continue
        shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: alive
        return True
    return True


def make_session(
    nodes: list[bytes],
    consts: dict[str, np.ndarray],
    inputs: list[bytes],
    outputs: list[bytes],
    threads: int,
) -> Any:
    """An onnxruntime CPU session for the graph of `nodes` (onnx_proto's NodeProtos, as the
    value infos `inputs` and `outputs`) over the named constants `consts`. Where the matrices
    it repacks are large (FILE_BYTES), the large constants go through scratch files and are
    taken out of `consts`, so the caller's dict holds none of them after the call."""
    import onnxruntime as ort

    options = session_options(threads)
    inits = [onnx_proto.tensor(n, a) for n, a in consts.items() if a.nbytes < EXTERNAL_BYTES]
    large = [name for name, array in consts.items() if array.nbytes >= EXTERNAL_BYTES]
    with contextlib.ExitStack() as stack:
        filed = None
        if sum(consts[name].nbytes for name in large if prepacked(name)) >= FILE_BYTES:
            filed = _file_constants(consts, large, options, stack)
        if filed is not None:
            inits += filed
        elif large:
            for name in large:
                inits.append(onnx_proto.external_tensor(name, consts[name]))
            values = [
                ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(consts[n])) for n in large
            ]
            options.add_external_initializers(large, values)  # copied in at session creation
        model = onnx_proto.model(nodes, inputs, outputs, inits, OPSETS)
        return_freed_memory()  # what built the constants, before onnxruntime copies and packs them
        return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def return_freed_memory() -> None:
    """Hands freed heap pages back to the OS: glibc keeps freed memory for reuse, so the
    codes, fused copies and constants a load builds and drops would otherwise stay resident
    (and raise the load's peak). Elsewhere than glibc it does nothing."""
    with contextlib.suppress(OSError, AttributeError):  # another C library: its own policy
        ctypes.CDLL("libc.so.6").malloc_trim(0)


@dataclass(frozen=True)
class OrtNBitsWeight:
    """A (N, K) group-quantized matrix as an onnxruntime session: x (T, K) float32 → (T, N)."""

    session: Any
    shape: tuple[int, int]
    bits: int
    input_dtype = torch.float32  # MLAS quantizes float32 activations to int8 per block itself

    @classmethod
    def from_affine(cls, w: GroupAffine, threads: int) -> OrtNBitsWeight:
        """Builds the session for the file's codes `w` (4- or 8-bit, blocks of `w.group`), at
        the module's `ACCURACY`."""
        if w.bits not in _CODE_SHIFT:
            raise ValueError(f"MatMulNBits takes 4- or 8-bit codes, got {w.bits}-bit")
        n, k = w.q.shape
        if k % w.group:
            raise ValueError(f"in_features={k} is not a multiple of {w.group}")
        nodes, consts = linear_nodes(w, "A", "Y")
        session = make_session(
            nodes,
            consts,
            [onnx_proto.value_info("A", onnx_proto.FLOAT, ["T", k])],
            [onnx_proto.value_info("Y", onnx_proto.FLOAT, ["T", n])],
            threads,
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
