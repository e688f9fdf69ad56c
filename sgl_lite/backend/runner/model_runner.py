"""ModelRunner: owns the model weights and the KV pool, and runs one forward over a batch.

A batch is a list of segments, one per request: the new tokens to compute, where they start, and
the slots of the request's whole sequence (cached prefix + new tokens). The runner turns those
into the attention metadata the model needs and returns the logits rows asked for. It knows
nothing about requests, sampling or the radix tree.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TypeVar

import torch
from torch import nn
from transformers import PretrainedConfig

from sgl_lite.backend.config import EngineConfig
from sgl_lite.backend.kvcache.kv_pool import KVPool
from sgl_lite.backend.runner.decode_attention import (
    decodes_over_copies,
    found_shared,
    reads_shared_prefixes,
)
from sgl_lite.backend.runner.decode_graphs import DecodeGraphs
from sgl_lite.backend.runner.decode_kv import DecodeKV, KVView
from sgl_lite.backend.runner.model_loader import (
    ModelLoadError,
    gguf_source,
    load_config,
    load_state_dict,
)
from sgl_lite.backend.runner.models import build_model, family_of
from sgl_lite.backend.runner.models.attention import Attention, head_dim_of
from sgl_lite.backend.runner.models.metadata import AttentionGroup, AttentionMetadata
from sgl_lite.backend.runner.models.rope import RotaryEmbedding
from sgl_lite.backend.runner.models.shared_prefix import SharedPrefixes, placed
from sgl_lite.backend.runner.ort_step import OrtDecodeStep
from sgl_lite.backend.runner.passes import graph_passes, merge_outputs, split_final_rows
from sgl_lite.backend.runner.weights import ort_nbits
from sgl_lite.backend.runner.weights.choose import prepare_weights
from sgl_lite.backend.runner.weights.codes_plan import (
    DENSE_LINEARS_ENV,
    codes_only_linears,
    read_file_codes,
)
from sgl_lite.backend.runner.weights.embedding import FileEmbedding
from sgl_lite.backend.runner.weights.packing import (
    HEAD,
    dense_from_codes_names,
    fill_dense_from_codes,
)
from sgl_lite.backend.types import ForwardOutput, Segment

ModelT = TypeVar("ModelT", bound=nn.Module)

logger = logging.getLogger("sgl_lite")


class ModelRunner:
    """Weights, KV pool and the batched forward pass."""

    def __init__(self, model_folder: Path, config: EngineConfig) -> None:
        started = time.perf_counter()
        self.device = _checked_device(config.device)
        self.hf_config = load_config(model_folder)
        self.context_length = context_length_of(self.hf_config, config.context_length)
        with torch.device("meta"):  # no random init: every weight is loaded below
            model = build_model(self.hf_config, self.context_length)  # RoPE tables on the CPU
        codes = read_file_codes(model_folder, self.hf_config, config, self.device)
        formats = codes.formats() if codes is not None else {}
        plan = codes_only_linears(model, formats, config)
        # Codes-only linears are decoded from the file one at a time as the graph takes them;
        # where dense copies are kept, every code is decoded now (the copies and each kernel
        # read them).
        quantized = {} if codes is None else codes if plan.names else codes.materialize()
        # Linears with codes get their dense copy from them (fill_dense_from_codes, below).
        from_codes = dense_from_codes_names(model, quantized, plan.names)
        state = load_state_dict(model_folder, self.hf_config, skip={*plan.names, *from_codes})
        for name in [*plan.names, *from_codes]:  # a shape for the checks, no memory
            state[name] = torch.empty(formats[name].q.shape, device="meta")
        try:
            model.load_hf_state_dict(state)
        except ModelLoadError as exc:  # it names the tensor; add the folder
            raise ModelLoadError(f"{model_folder}: {exc}") from exc
        # The fused linears are copies (q/k/v, gate/up concatenated): the checkpoint's own
        # tensors would otherwise stay alive beside them until the runner is built.
        del state
        fill_dense_from_codes(model, quantized, from_codes)
        self.format, pack_note, self.decode_step = prepare_weights(
            model, model_folder, config, self.device, quantized, plan
        )
        # The token table was never read dense: lookups read its rows from the file the codes
        # came from (`read_file_codes`).
        if HEAD in plan.names and (source := gguf_source(model_folder)) is not None:
            model.embed_tokens = FileEmbedding(source, self.format.dense_dtype)
            pack_note += "; token table read from the file"
        del quantized, codes
        self.model = _placed(model, self.device, self.format.dense_dtype).eval()
        # Where every pass runs on the graph there are no dense linears, and a tied head's
        # prepacked table would be a second copy of the embeddings that nothing reads.
        every_pass = self.decode_step is not None and self.decode_step.every_pass
        if not every_pass and self.model.prepack_dense():
            pack_note += "; dense weights in oneDNN's layout"
        for module in self.model.modules():
            if isinstance(module, Attention):
                module.attn_dtype = self.format.attn_dtype
        self.shared_prefixes = reads_shared_prefixes(self.device, self.format, self.model)
        self.vocab_size = self.hf_config.vocab_size
        self.pool = KVPool(
            num_layers=self.hf_config.num_hidden_layers,
            num_slots=config.max_total_tokens,
            num_kv_heads=self.hf_config.num_key_value_heads,
            head_dim=head_dim_of(self.hf_config),
            dtype=self.format.dense_dtype,
            device=self.device,
            scratch_slots=1,  # for the padded rows of graph-captured decode steps
        )
        # Captured decode steps build their own masks, without windows.
        sliding = getattr(self.model, "sliding_window", None) is not None
        self.graphs = DecodeGraphs(self) if DecodeGraphs.wanted(self) and not sliding else None
        # Decode copies (decode_kv): the torch step's in the dtype its attention computes in;
        # the onnxruntime step's own in float32 (whatever the pool's dtype).
        self.decode_kv = (
            DecodeKV(self.pool, self.format.attn_dtype) if self.graphs is None else None
        )
        self.step_kv = (
            DecodeKV(self.pool, torch.float32) if self.decode_step and self.graphs is None else None
        )
        # Every pass on the graph: copies of their own for each group of rows (`_graph_passes`).
        self.kv_lanes: list[DecodeKV] = []
        if self.decode_step is not None:
            pack_note += self._probe_decode_step()
        ort_nbits.return_freed_memory()  # the load's codes, copies and protobufs
        logger.info(
            "sgl_lite weights: %s%s; load %.1fs",
            self.format.describe(),
            pack_note,
            time.perf_counter() - started,
        )

    def forward(self, segments: list[Segment]) -> ForwardOutput:
        """Runs the segments; returns the requested logits rows of all of them.

        In the fast mode a segment's last token, whose logits pick the next token, is computed
        in a second pass of single tokens (see `split_final_rows`), so a greedy request sent
        twice repeats whether the second one hits the radix cache or not.
        """
        fmt = getattr(self, "format", None)  # absent on runners built around a bare model
        split = split_final_rows(segments) if fmt is not None and not fmt.deterministic else None
        if split is None:
            return self._forward_pass(segments)
        head, tail = split
        return merge_outputs(
            len(segments),
            [
                (head, self._forward_pass([s for _, s in head])),
                (tail, self._forward_pass([s for _, s in tail])),
            ],
        )

    def _forward_pass(self, segments: list[Segment]) -> ForwardOutput:
        """Runs one pass over all segments; returns the requested logits rows of all of them."""
        if not segments:
            return ForwardOutput(None, [])
        graphs = getattr(self, "graphs", None)  # absent on runners built around a bare model
        if graphs is not None:
            replayed = graphs.run(segments)
            if replayed is not None:
                return replayed
        step = getattr(self, "decode_step", None)
        if step is not None and step.every_pass:
            return self._graph_passes(step, segments)
        decode_kv = getattr(self, "decode_kv", None)
        step_kv = getattr(self, "step_kv", None)
        lanes = getattr(self, "kv_lanes", [])
        # One set of decode copies at a time (each may be large): the path that runs releases
        # the others'.
        if step is not None and step_kv is not None:
            if step.takes(segments) and not self._cascades(segments):
                stepped = step.run(segments, self.pool, step_kv)
                if stepped is not None:
                    _release(decode_kv, *lanes)
                    return stepped
            elif step.takes_in_groups(segments) and not self._cascades(segments):
                _release(decode_kv, step_kv)
                return self._graph_passes(step, segments)
        input_ids = torch.tensor(
            [t for seg in segments for t in seg.token_ids], dtype=torch.long, device=self.device
        )
        meta = self._metadata(segments, self._use_int(len(input_ids)))
        if decode_kv is not None and decode_kv.nbytes:
            _release(step_kv, *lanes)  # a decode batch the graph does not take
        try:
            hidden = self.model(input_ids, meta, self.pool)  # (T, hidden)
        except BaseException:
            if decode_kv is not None:
                decode_kv.reset()  # its copies may be half-updated
            raise
        rows: list[int] = []
        ranges: list[tuple[int, int]] = []
        offset = 0
        for seg in segments:
            first = len(rows)
            rows.extend(range(offset + seg.logits_from, offset + len(seg.token_ids)))
            ranges.append((first, len(rows)))
            offset += len(seg.token_ids)
        if rows:
            picked = hidden.index_select(0, torch.tensor(rows, device=hidden.device))
            logits = self.model.compute_logits(picked, self._use_int(len(rows)))  # (R, vocab)
        else:
            logits = None
        return ForwardOutput(logits, ranges)

    def _probe_decode_step(self) -> str:
        """Runs the onnxruntime step once on a short prompt and checks its logits are finite:
        a kernel that overflows or misreads this file's codes on this machine would otherwise
        decode from NaN. A failure drops the step (decodes run on torch), or, where the model
        has no dense linears to run instead, is a ModelLoadError. Returns the start-up note."""
        step = self.decode_step
        assert step is not None
        ids = [i % self.vocab_size for i in range(1, 5)]
        slots = self.pool.alloc(len(ids))
        assert slots is not None  # a fresh pool
        segment = Segment(token_ids=ids, start=0, kv_slots=slots, logits_from=0)
        try:
            logits = self._forward_pass([segment]).logits
        finally:
            self.pool.free(slots)
            for copies in [self.decode_kv, self.step_kv, *self.kv_lanes]:
                if copies is not None:
                    copies.reset()
        if logits is not None and bool(torch.isfinite(logits).all()):
            return ""
        why = "the onnxruntime step gave non-finite logits on a probe prompt"
        if step.every_pass:
            raise ModelLoadError(f"{why}; set {DENSE_LINEARS_ENV}=1 to run the dense weights")
        logger.warning("sgl_lite weights: %s; decode steps on torch", why)
        self.decode_step = self.step_kv = None
        return f"; {why}: decode steps on torch"

    def _graph_passes(self, step: OrtDecodeStep, segments: list[Segment]) -> ForwardOutput:
        """A pass on the onnxruntime graph in runs (every pass of a model with no dense
        linears; a decode batch larger than one run beside float32 dense weights), each group
        of rows on decode copies of its own (`passes.graph_passes`), the copies bounded by
        twice the pool's bytes."""
        return graph_passes(step, segments, self.pool, self.kv_lanes, 2 * self.pool.nbytes)

    def _use_int(self, tokens: int) -> bool:
        """Whether a pass over `tokens` rows runs the packed int kernels: every pass in the
        deterministic mode, so a token's K/V is the same whichever pass computed it; short
        passes in the fast mode (see formats)."""
        fmt = getattr(self, "format", None)  # absent on runners built around a bare model
        return fmt is not None and fmt.runs_int(tokens)

    def _metadata(self, segments: list[Segment], use_int: bool = False) -> AttentionMetadata:
        dev = self.device
        offsets = [0]
        for seg in segments:
            offsets.append(offsets[-1] + len(seg.token_ids))
        positions = torch.cat([torch.arange(s.start, s.end) for s in segments]).to(dev)
        cos, sin = self.model.rope.tables(positions, self.model.dtype)
        decodes = [i for i, s in enumerate(segments) if len(s.token_ids) == 1]
        extends = [i for i, s in enumerate(segments) if len(s.token_ids) > 1]
        decode_kv = getattr(self, "decode_kv", None)  # absent on runners built around a model
        shared = self._shared_prefixes([segments[i] for i in decodes])
        kv_view = None
        if shared is None and decode_kv is not None:
            kv_view = decode_kv.plan(segments)
        elif decode_kv is not None:
            decode_kv.release()  # not read while prefixes are shared; gathered afresh after
        groups = tuple(
            self._group(
                [segments[i] for i in members],
                [offsets[i] for i in members],
                offsets[-1],
                kv_view,
                shared if members is decodes else None,
            )
            for members in (extends, decodes)
            if members
        )
        return AttentionMetadata(
            positions=positions,
            cos=cos,
            sin=sin,
            out_slots=torch.cat([s.kv_slots[s.start :] for s in segments]).to(dev),
            groups=groups,
            use_int=use_int,
        )

    def _cascades(self, segments: list[Segment]) -> bool:
        """Whether a decode batch the graph takes (in one run or in groups) runs on the torch
        step instead, for the prefixes its rows share: the graph's attention reads every row's
        whole context, the torch step reads a shared prefix once (`_shared_prefixes`). On an
        AVX2 CPU (float32 dense weights) W1 ties either way. Measured on W1 (8
        conversations on one ~300-token system prompt, 8-row steps; 3 interleaved pairs): wall
        5.97 / 5.81 / 6.10 s on the graph, 5.51 / 5.50 / 5.81 s on the torch step. The graph
        takes several rows only as single-token decodes, so `segments` are decodes here."""
        return found_shared(segments, getattr(self, "shared_prefixes", False)) is not None

    def _shared_prefixes(self, decodes: list[Segment]) -> SharedPrefixes | None:
        """The prefixes the decode rows share, placed for attention (`found_shared`)."""
        shared = found_shared(decodes, getattr(self, "shared_prefixes", False))
        return None if shared is None else placed(shared, self.device, self.pool.k.dtype)

    def _group(
        self,
        segments: list[Segment],
        offsets: list[int],
        total: int,
        kv_view: KVView | None,
        shared: SharedPrefixes | None = None,
    ) -> AttentionGroup:
        lens = [len(s.token_ids) for s in segments]
        q_lens = torch.tensor(lens)
        batch, max_q = len(segments), max(lens)
        padded = min(lens) < max_q  # some rows of the (B, Q) query layout are padding
        max_k = max(s.end for s in segments)
        i = torch.arange(max_q)
        q_valid = i[None, :] < q_lens[:, None]  # (B, Q)
        q_rows = torch.tensor(offsets)[:, None] + i[None, :]  # (B, Q) rows in the flat matrix
        q_pos = torch.tensor([s.start for s in segments])[:, None] + i[None, :]  # (B, Q)
        kv_slots = torch.zeros(batch, max_k, dtype=torch.long)
        for b, seg in enumerate(segments):
            kv_slots[b, : seg.end] = seg.kv_slots
        # A query sees keys at positions <= its own; keys past a row's length are padding.
        mask = torch.arange(max_k)[None, None, :] <= q_pos[:, :, None]  # (B, Q, K)
        # Padding query rows attend to key 0 only, so softmax never sees an all-masked row.
        if padded:
            mask &= q_valid[:, :, None]
            mask[:, :, 0] |= ~q_valid
        # Sliding-window layers (Gemma) see keys in (p - window, p]; only long groups cut any.
        window = getattr(self.model, "sliding_window", None)
        near = None
        if window is not None and max_k > window:
            near = mask & (torch.arange(max_k)[None, None, :] > q_pos[:, :, None] - window)
            if padded:
                near[:, :, 0] |= ~q_valid
        # The G query heads of one KV head attend as G*Q query rows (see Attention._attend).
        config = self.model.config
        per_kv = config.num_attention_heads // config.num_key_value_heads

        def per_head_rows(m: torch.Tensor) -> torch.Tensor:  # (B, Q, K) → (B, 1, G*Q, K)
            m = m[:, None, None].expand(batch, 1, per_kv, max_q, max_k)
            return m.reshape(batch, 1, per_kv * max_q, max_k).to(self.device)

        full_mask = None if bool(mask.all()) else per_head_rows(mask)
        window_mask = None if near is None else per_head_rows(near)
        dev = self.device
        # The real queries' positions, from the lengths in Python: boolean indexing and
        # nonzero on these tiny tensors cost ~0.4 ms a pass, 1 % of a batch-1 decode step.
        q_flat = [b * max_q + j for b, n in enumerate(lens) for j in range(n)]
        rows = [offsets[b] + j for b, n in enumerate(lens) for j in range(n)]
        capacity_bias = None
        if (
            kv_view is not None
            and near is None
            and decodes_over_copies(self.device, batch, kv_view)
        ):
            ends = torch.tensor([s.end for s in segments])
            past = torch.arange(kv_view.capacity)[None, :] >= ends[:, None]  # (B, capacity)
            capacity_bias = torch.zeros(batch, 1, 1, kv_view.capacity).masked_fill_(
                past[:, None, None, :], float("-inf")
            )
        return AttentionGroup(
            q_index=(torch.where(q_valid, q_rows, 0) if padded else q_rows).to(dev),
            q_flat=torch.tensor(q_flat, dtype=torch.long, device=dev),
            rows=torch.tensor(rows, dtype=torch.long, device=dev),
            kv_slots=kv_slots.to(dev),
            kv_flat=kv_slots.flatten().to(dev),
            mask=full_mask,
            window_mask=window_mask,
            rows_in_order=max_q == 1 and total == batch,  # then offsets are 0..B-1
            causal=max_q > 1 and near is None and all(s.start == 0 for s in segments),
            kv_view=kv_view,
            shared=shared,
            capacity_bias=capacity_bias,  # only on the CPU (`decodes_over_copies`)
        )


def _release(*copies: DecodeKV | None) -> None:
    """Frees the decode copies that hold any memory (they gather afresh when next used)."""
    for each in copies:
        if each is not None and each.nbytes:
            each.release()


def context_length_of(hf_config: PretrainedConfig, requested: int | None) -> int:
    """The longest sequence a runner of this model takes: `requested` (the config's
    `context_length`; None for the model's own), within what the model is exact for."""
    model_max = getattr(hf_config, "max_position_embeddings", 2048)
    model_class = family_of(hf_config).model
    # Llama attends over the whole sequence; a sliding-window model (Mistral) is exact only
    # up to its window, so the window bounds the context. Gemma masks windows per layer.
    window = getattr(hf_config, "sliding_window", None)
    in_mask = getattr(model_class, "sliding_window_in_mask", False)
    if getattr(hf_config, "use_sliding_window", True) and window and not in_mask:
        model_max = min(model_max, window)
    return min(requested or model_max, model_max)


def _placed(model: ModelT, device: torch.device, dtype: torch.dtype) -> ModelT:
    """`model` on `device` with its weights in `dtype`; RoPE tables stay float32.

    The tables are looked up once per pass and cast to the activations' dtype there; had they
    gone through `dtype` here, a float16 model would get bf16-rounded positions (a float32 →
    bf16 → float32 round trip cannot restore the bits).
    """
    ropes = [m for m in model.modules() if isinstance(m, RotaryEmbedding)]
    tables = [(m.cos, m.sin) for m in ropes]
    model.to(device=device, dtype=dtype)
    for rope, (cos, sin) in zip(ropes, tables):
        rope.cos, rope.sin = cos.to(device), sin.to(device)
    return model


def _checked_device(device: str) -> torch.device:
    """The torch device, or a clear error when the machine does not have it."""
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"device={device!r} but CUDA is not available (torch {torch.__version__}, "
            f"cuda build: {torch.version.cuda}); available: cpu"
        )
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be cpu or cuda, got {device!r}")
    if dev.type == "cuda":
        # Always with an index: `torch.cuda.set_device` (each loop thread calls it) refuses a
        # bare "cuda", and the engine's tensors must all live on the one device it names.
        index = torch.cuda.current_device() if dev.index is None else dev.index
        if index >= torch.cuda.device_count():
            raise ValueError(
                f"device={device!r} but this machine has {torch.cuda.device_count()} CUDA "
                f"device(s): use cuda:0 to cuda:{torch.cuda.device_count() - 1}"
            )
        dev = torch.device("cuda", index)
    return dev
