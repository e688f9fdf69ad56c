"""GGUF files other than the embedded one: a tiny random model written as GGUF in the test
loads through `Engine(model_path=file)` exactly like the same weights saved as safetensors,
with the file's tokenizer and chat template; bad files are refused by name before any work."""

from __future__ import annotations

import logging
import os
import shutil

import pytest
import torch
from transformers import LlamaConfig, Qwen2Config, Qwen3Config

from sgl_lite.backend.config import EngineConfig
from sgl_lite.backend.engine import Engine
from sgl_lite.backend.runner.model_loader import (
    ModelLoadError,
    gguf_source,
    load_config,
    load_state_dict,
    load_tokenizer,
    resolve_model_path,
)
from sgl_lite.backend.runner.model_runner import ModelRunner
from sgl_lite.backend.runner.weights.gguf_tensors import read_quantized
from sgl_lite.backend.runner.weights.quant import GroupAffine
from sgl_lite.backend.types import Segment
from tests.support import NUM_THREADS
from tests.support.gguf_files import (
    GREEDY,
    PROMPTS,
    greedy_ids,
    save_folder,
    tiny_model,
    write_gguf,
)
from tests.support.tiny import build_tiny_tokenizer

# Conversions go to each test's own folder (tests/conftest.py), never the user's cache.
pytestmark = pytest.mark.usefixtures("private_cache")


def _prefill_logits(folder, ids: list[int]) -> torch.Tensor:
    # dense weights only: the file's own codes would run the int kernels on a short pass
    config = EngineConfig(max_total_tokens=256, device="cpu", quantization="none")
    runner = ModelRunner(folder, config)
    slots = runner.pool.alloc(len(ids))
    seg = Segment(token_ids=ids, start=0, kv_slots=slots, logits_from=0)
    logits = runner.forward([seg]).logits
    runner.pool.free(slots)
    return logits


CASES = {
    "llama-f32": (LlamaConfig, "llama", None, {"tie_word_embeddings": False}),
    "llama-tied-q8_0": (LlamaConfig, "llama", "Q8_0", {"tie_word_embeddings": True}),
    "qwen2-f32": (Qwen2Config, "qwen2", None, {"tie_word_embeddings": False}),
    # per-head q/k norms, and a head size of its own (32, not hidden / heads = 16)
    "qwen3-tied-q8_0": (
        Qwen3Config,
        "qwen3",
        "Q8_0",
        {"tie_word_embeddings": True, "head_dim": 32},
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_gguf_file_loads_like_the_same_weights_from_safetensors(tmp_path, tiny_tokenizer, case):
    config_cls, arch, quant, overrides = CASES[case]
    model = tiny_model(config_cls, tiny_tokenizer, **overrides)
    gguf_file = tmp_path / f"tiny-{case}.gguf"
    state = write_gguf(gguf_file, model, tiny_tokenizer, architecture=arch, quantize_linears=quant)
    folder = save_folder(tmp_path / "st", model, state, tiny_tokenizer)

    converted = resolve_model_path(gguf_file)
    assert not list(converted.glob("*.safetensors"))  # weights are read from the file itself
    weights = load_state_dict(converted, load_config(converted))
    assert set(weights) == set(state)
    for name, tensor in state.items():  # q/k un-permuted, Q8_0 dequantized as the file says
        assert torch.equal(weights[name], tensor), name
    assert load_config(converted).model_type == arch

    ids = tiny_tokenizer.encode(PROMPTS[0] + " Paris is a city in France.")
    ours, theirs = _prefill_logits(converted, ids), _prefill_logits(folder, ids)
    assert (ours - theirs).abs().max() <= 1e-4
    for disable in (False, True):
        assert greedy_ids(gguf_file, tiny_tokenizer, disable) == greedy_ids(
            folder, tiny_tokenizer, disable
        )


@pytest.mark.parametrize(("kind", "bits"), [("Q8_0", 8), ("Q4_0", 4), ("Q4_1", 4)])
def test_quantized_codes_of_a_written_gguf_are_exactly_its_converted_weights(
    tmp_path, tiny_tokenizer, kind, bits
):
    model = tiny_model(LlamaConfig, tiny_tokenizer, tie_word_embeddings=False)
    gguf_file = tmp_path / f"tiny-{kind}.gguf"
    state = write_gguf(gguf_file, model, tiny_tokenizer, quantize_linears=kind)
    converted = resolve_model_path(gguf_file)
    assert gguf_source(converted) == gguf_file.resolve()
    codes = read_quantized(gguf_file, load_config(converted))
    assert len(codes) == 7 * 2 and {c.bits for c in codes.values()} == {bits}
    for name, weight in codes.items():  # q/k rows un-permuted like transformers' loader
        assert torch.equal(weight.dequantize(), state[name]), name
    # a fused linear's parts were decoded together: fusing them copies nothing
    qkv = [codes[f"model.layers.0.self_attn.{p}_proj.weight"] for p in "qkv"]
    fused = GroupAffine.cat(qkv)
    assert fused.q.data_ptr() == qkv[0].q.data_ptr()
    assert torch.equal(
        fused.dequantize(),
        torch.cat([state[f"model.layers.0.self_attn.{p}_proj.weight"] for p in "qkv"]),
    )


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_1"])
def test_the_fast_modes_dense_linears_are_the_files_weights_from_their_codes(
    tmp_path, tiny_tokenizer, kind
):
    # fill_dense_from_codes builds them from the fused codes instead of a second read
    model = tiny_model(LlamaConfig, tiny_tokenizer, tie_word_embeddings=False)
    gguf_file = tmp_path / f"tiny-{kind}.gguf"
    state = write_gguf(gguf_file, model, tiny_tokenizer, quantize_linears=kind)
    # The file's own kind asked for: under `auto` a tiny model's kernels time alike (0.0 ms)
    # and the probe may keep dense weights alone, which this test is not about.
    quantization = "int8" if kind == "Q8_0" else "int4"
    config = EngineConfig(
        max_total_tokens=64, device="cpu", dtype="float32", quantization=quantization
    )
    runner = ModelRunner(resolve_model_path(gguf_file), config)
    assert runner.format.int_kind == quantization  # the fast mode, with the file's codes
    for i, layer in enumerate(runner.model.layers):
        p = f"model.layers.{i}."
        qkv = torch.cat([state[f"{p}self_attn.{n}_proj.weight"] for n in "qkv"])
        gate_up = torch.cat([state[f"{p}mlp.{n}_proj.weight"] for n in ("gate", "up")])
        assert torch.equal(layer.self_attn.qkv_proj.weight, qkv)
        assert torch.equal(layer.self_attn.o_proj.weight, state[f"{p}self_attn.o_proj.weight"])
        assert torch.equal(layer.mlp.gate_up_proj.weight, gate_up)
        assert torch.equal(layer.mlp.down_proj.weight, state[f"{p}mlp.down_proj.weight"])


def test_tokenizer_and_chat_template_come_from_the_file(tmp_path, tiny_tokenizer):
    model = tiny_model(LlamaConfig, tiny_tokenizer)
    template = "{% for m in messages %}<<{{ m['role'] }}>>{{ m['content'] }}{% endfor %}"
    custom = build_tiny_tokenizer()
    custom.chat_template = template
    gguf_file = tmp_path / "holder" / "model.gguf"
    gguf_file.parent.mkdir()
    write_gguf(gguf_file, model, custom)
    # a folder holding exactly one .gguf and no config.json is that file
    converted = resolve_model_path(gguf_file.parent)
    assert converted == resolve_model_path(gguf_file)
    loaded = load_tokenizer(converted)
    assert loaded.chat_template == template
    text = "What is the capital of France? <|im_end|>"
    assert loaded.encode(text) == tiny_tokenizer.encode(text)
    assert (loaded.bos_token, loaded.eos_token) == ("<|im_start|>", "<|im_end|>")


def test_a_rewritten_gguf_is_converted_again(tmp_path, tiny_tokenizer):
    gguf_file = tmp_path / "tiny.gguf"
    first = write_gguf(gguf_file, tiny_model(LlamaConfig, tiny_tokenizer, seed=0), tiny_tokenizer)
    folder_a = resolve_model_path(gguf_file)
    # same size, same header: only the weights (and the mtime) differ
    second = write_gguf(gguf_file, tiny_model(LlamaConfig, tiny_tokenizer, seed=1), tiny_tokenizer)
    stat = gguf_file.stat()
    os.utime(gguf_file, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    folder_b = resolve_model_path(gguf_file)
    assert folder_b != folder_a
    name = "model.layers.0.mlp.up_proj.weight"
    assert torch.equal(load_state_dict(folder_b, load_config(folder_b))[name], second[name])
    assert not torch.equal(first[name], second[name])
    assert gguf_source(folder_a) is None  # its source no longer holds its weights
    assert gguf_source(folder_b) == gguf_file.resolve()


def test_each_copy_of_a_gguf_gets_its_folder_and_a_deleted_ones_is_swept(tmp_path, tiny_tokenizer):
    # A checkout's embedded model is a copy of one file at a new place: its folder must name
    # that copy (the other may be deleted), and folders of deleted copies must not pile up.
    first = tmp_path / "a" / "tiny.gguf"
    first.parent.mkdir()
    write_gguf(first, tiny_model(LlamaConfig, tiny_tokenizer, seed=0), tiny_tokenizer)
    copies = [tmp_path / name / "tiny.gguf" for name in ("b", "c")]
    for copy in copies:
        copy.parent.mkdir()
        shutil.copy2(first, copy)  # same bytes, same mtime
    folder_a, folder_b = resolve_model_path(first), resolve_model_path(copies[0])
    assert folder_a != folder_b
    assert (gguf_source(folder_a), gguf_source(folder_b)) == (first.resolve(), copies[0].resolve())
    first.unlink()
    assert gguf_source(folder_b) == copies[0].resolve()
    folder_c = resolve_model_path(copies[1])  # a new folder sweeps the orphans first
    assert not folder_a.exists()
    assert folder_b.exists() and folder_c.exists()


def test_a_q4_gguf_feeds_its_codes_to_the_int4_kernels(tmp_path, tiny_tokenizer, caplog):
    model = tiny_model(LlamaConfig, tiny_tokenizer, hidden_size=256, intermediate_size=512)
    gguf_file = tmp_path / "tiny-q4.gguf"
    write_gguf(gguf_file, model, tiny_tokenizer, quantize_linears="Q4_0")
    with (
        caplog.at_level(logging.INFO, logger="sgl_lite"),
        Engine(
            model_path=str(gguf_file),
            num_threads=NUM_THREADS,
            max_total_tokens=256,
            quantization="int4",
        ) as engine,
    ):
        out = engine.generate(input_ids=tiny_tokenizer.encode(PROMPTS[0]), sampling_params=GREEDY)
    assert len(out["output_ids"]) == GREEDY["max_new_tokens"]
    # 2 layers x (fused qkv, o, fused gate_up, down), every one packed from the file's codes
    assert "packed 8 linears (8 from the file's codes)" in caplog.text


@pytest.mark.parametrize("arch", ["gpt2", "phi2"])
def test_a_gguf_of_an_architecture_we_do_not_run_is_refused_by_name(
    tmp_path, tiny_tokenizer, private_cache, arch
):
    gguf_file = tmp_path / f"{arch}.gguf"
    write_gguf(
        gguf_file, tiny_model(LlamaConfig, tiny_tokenizer), tiny_tokenizer, architecture=arch
    )
    with pytest.raises(ModelLoadError, match=f"{arch}.gguf.*architecture '{arch}'.*llama, mistral"):
        Engine(model_path=str(gguf_file), num_threads=NUM_THREADS, max_total_tokens=64)
    assert not (private_cache / "models").exists()  # refused before any conversion work


@pytest.mark.parametrize("keep", [0, 3, 200, -100])
def test_a_truncated_or_corrupt_gguf_is_refused_naming_the_file(tmp_path, tiny_tokenizer, keep):
    whole = tmp_path / "whole.gguf"
    write_gguf(whole, tiny_model(LlamaConfig, tiny_tokenizer), tiny_tokenizer)
    data = whole.read_bytes()
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(data[:keep] if keep >= 0 else data[:keep])
    with pytest.raises(ModelLoadError, match="broken.gguf"):
        resolve_model_path(broken)


def test_a_folder_with_several_ggufs_and_no_config_asks_for_one(tmp_path, tiny_tokenizer):
    for name in ("a.gguf", "b.gguf"):
        write_gguf(tmp_path / name, tiny_model(LlamaConfig, tiny_tokenizer), tiny_tokenizer)
    with pytest.raises(ModelLoadError, match="2 .gguf files.*a.gguf, b.gguf"):
        resolve_model_path(tmp_path)


# llama.cpp's Q4_K_M: Q4_K on most linears, Q6_K on v and down (half the layers in a real file)
Q4_K_M = {
    "q_proj": "Q4_K",
    "k_proj": "Q4_K",
    "o_proj": "Q4_K",
    "gate_proj": "Q4_K",
    "up_proj": "Q4_K",
    "v_proj": "Q6_K",
    "down_proj": "Q6_K",
}


def test_a_k_quant_file_runs_its_own_codes_in_the_decode_step(
    tmp_path, tiny_tokenizer, caplog, monkeypatch
):
    """A Q4_K_M-like file (Q4_K beside Q6_K, fused q/k/v of both) loads like the same weights
    from safetensors, and its decode step runs the file's codes exactly: 4-bit in groups of 32
    where a fused linear is all Q4_K, 8-bit in groups of 16 where it holds Q6_K."""
    from sgl_lite.backend.runner.weights import codes_plan
    from sgl_lite.backend.runner.weights.packing import exact_codes

    monkeypatch.setenv(codes_plan.DENSE_LINEARS_ENV, "1")  # dense linears for long passes

    model = tiny_model(LlamaConfig, tiny_tokenizer, hidden_size=256, intermediate_size=512)
    gguf_file = tmp_path / "tiny-q4_k_m.gguf"
    state = write_gguf(gguf_file, model, tiny_tokenizer, random_blocks=Q4_K_M)
    converted = resolve_model_path(gguf_file)
    weights = load_state_dict(converted, load_config(converted))
    for name, tensor in state.items():  # the reader dequantizes what write_gguf wrote
        assert torch.equal(weights[name], tensor), name
    codes = read_quantized(gguf_file, load_config(converted))
    assert len(codes) == 7 * 2
    for name, weight in codes.items():
        assert torch.equal(weight.dequantize(), state[name]), name
    config = EngineConfig(max_total_tokens=256, device="cpu", num_threads=NUM_THREADS)
    with caplog.at_level(logging.INFO, logger="sgl_lite"):
        runner = ModelRunner(converted, config)
    assert runner.format.int_kind == "int8", runner.format.describe()
    assert "the file's linears: 4 4-bit/32, 4 8-bit/16" in caplog.text
    assert runner.decode_step is not None, runner.format.describe()
    # the step on those codes computes the file's model (float32 dense weights as the judge)
    dense = EngineConfig(
        max_total_tokens=256,
        device="cpu",
        num_threads=NUM_THREADS,
        quantization="none",
        dtype="float32",
    )
    reference = ModelRunner(converted, dense)
    linears, _ = exact_codes(reference.model, "int8", codes)
    fused_qkv = torch.cat([state[f"model.layers.0.self_attn.{p}_proj.weight"] for p in "qkv"])
    assert torch.equal(linears["0.self_attn.qkv_proj"].dequantize(), fused_qkv)
    assert (linears["0.mlp.gate_up_proj"].bits, linears["0.mlp.down_proj"].group) == (4, 16)
    ids = tiny_tokenizer.encode(PROMPTS[1])
    decoded = []
    for each in (runner, reference):
        slots = each.pool.alloc(len(ids))
        prefix = len(ids) - 1
        head = Segment(token_ids=ids[:prefix], start=0, kv_slots=slots[:prefix], logits_from=prefix)
        each.forward([head])
        step = Segment(token_ids=ids[prefix:], start=prefix, kv_slots=slots, logits_from=0)
        assert each is reference or runner.decode_step.takes([step])
        decoded.append(each.forward([step]).rows(0))
    got, want = decoded
    assert (got - want).abs().max() <= 0.05 * want.abs().max()


def test_the_decode_step_runs_the_files_codes_where_torchs_int_kernels_lose(
    tmp_path, tiny_tokenizer, monkeypatch
):
    """Where torch's int kernels lose to the dense GEMM (they are dropped for the short
    passes), decode steps still run the file's codes as one onnxruntime graph."""
    from sgl_lite.backend.runner.weights import choose, codes_plan

    monkeypatch.setattr(choose, "_choose", lambda *args: "dense is faster (forced by the test)")
    monkeypatch.setenv(codes_plan.DENSE_LINEARS_ENV, "1")  # the path that keeps dense linears
    model = tiny_model(LlamaConfig, tiny_tokenizer, hidden_size=256, intermediate_size=512)
    gguf_file = tmp_path / "tiny-q4.gguf"
    write_gguf(gguf_file, model, tiny_tokenizer, quantize_linears="Q4_0")
    config = EngineConfig(max_total_tokens=256, device="cpu", num_threads=NUM_THREADS)
    runner = ModelRunner(resolve_model_path(gguf_file), config)
    assert runner.format.int_kind is None and "forced by the test" in runner.format.reason
    assert runner.decode_step is not None, runner.format.describe()
    assert "one onnxruntime graph" in runner.format.reason


def _segments(pool, prompts: list[list[int]]) -> list[tuple[Segment, Segment]]:
    """Each prompt as (its prefill but the last token, that last token as a decode row); the
    prefills want every row's logits (prompt logprobs), none, or the last, in turn."""
    pairs = []
    for i, ids in enumerate(prompts):
        slots, prefix = pool.alloc(len(ids)), len(ids) - 1
        wanted = (0, prefix, prefix - 1)[i % 3]
        head = Segment(token_ids=ids[:prefix], start=0, kv_slots=slots[:prefix], logits_from=wanted)
        tail = Segment(token_ids=ids[prefix:], start=prefix, kv_slots=slots, logits_from=0)
        pairs.append((head, tail))
    return pairs


def test_without_dense_linears_the_token_table_is_read_from_the_file(
    tmp_path, tiny_tokenizer, monkeypatch
):
    """Codes-only linears and a tied head whose table the file keeps at 8 bits (Q6_K, as
    llama.cpp writes it): the table is never held, dense or as codes; lookups read the file and
    give the dense table's rows bit for bit (in the model's dtype), and the logits are the
    float32 reference's."""
    from sgl_lite.backend.runner.weights import codes_plan
    from sgl_lite.backend.runner.weights.embedding import FileEmbedding

    monkeypatch.setenv(codes_plan.DENSE_LINEARS_ENV, "0")
    model = tiny_model(
        LlamaConfig,
        tiny_tokenizer,
        hidden_size=256,
        intermediate_size=512,
        tie_word_embeddings=True,
    )
    gguf_file = tmp_path / "tiny-q4_0-q6_k-table.gguf"
    blocks = {"embed_tokens": "Q6_K"}
    write_gguf(gguf_file, model, tiny_tokenizer, quantize_linears="Q4_0", random_blocks=blocks)
    folder = resolve_model_path(gguf_file)
    runner = ModelRunner(folder, EngineConfig(max_total_tokens=256, device="cpu"))
    table_module = runner.model.embed_tokens
    assert isinstance(table_module, FileEmbedding)
    assert not [v for v in vars(table_module).values() if isinstance(v, torch.Tensor)]
    assert not list(table_module.buffers()) and not list(table_module.parameters())
    dense = EngineConfig(max_total_tokens=256, device="cpu", quantization="none", dtype="float32")
    reference = ModelRunner(folder, dense)
    assert isinstance(reference.model.embed_tokens, torch.nn.Embedding)
    ids = torch.tensor(tiny_tokenizer.encode(PROMPTS[0]))
    table = runner.model.embed_tokens(ids)  # the model's dtype, as the dense table was cast
    assert torch.equal(table, reference.model.embed_tokens(ids).to(table.dtype))
    rows = []
    for each in (runner, reference):
        slots = each.pool.alloc(len(ids))
        segment = Segment(token_ids=ids.tolist(), start=0, kv_slots=slots, logits_from=0)
        rows.append(each.forward([segment]).rows(0))
    got, want = rows
    assert (got - want).abs().max() <= 0.05 * want.abs().max()


@pytest.mark.parametrize(("quant", "lanes_kept"), [("Q4_0", True), ("Q8_0", True), ("Q4_0", False)])
def test_without_dense_linears_every_pass_runs_the_files_codes_on_the_graph(
    tmp_path, tiny_tokenizer, monkeypatch, quant, lanes_kept
):
    """With the file's codes as the only copy, prefill chunks (one request at a time), mixed
    passes and decode rows in several groups all run on the onnxruntime graph, and compute
    the file's model: every logits row near the float32 dense reference's; also where the
    copies' memory bound frees every lane after each run (each pass gathers afresh). Prompt
    chunks run in graph runs of up to 4 tokens here (`passes.GRAPH_RUN_TOKENS`), so each is
    several runs whose rows are put back together."""
    from sgl_lite.backend.kvcache.kv_pool import KVPool
    from sgl_lite.backend.runner import passes
    from sgl_lite.backend.runner.ort_step import OrtDecodeStep
    from sgl_lite.backend.runner.weights import codes_plan

    monkeypatch.setattr(passes, "GRAPH_RUN_TOKENS", 4)
    runs: list[int] = []
    real_run = OrtDecodeStep.run

    def counted(self, segments, pool, kv):
        runs.append(sum(len(s.token_ids) for s in segments))
        return real_run(self, segments, pool, kv)

    monkeypatch.setattr(OrtDecodeStep, "run", counted)

    if not lanes_kept:  # a pool of one byte: the lanes' budget is exceeded by any copy
        monkeypatch.setattr(KVPool, "nbytes", property(lambda self: 1))

    monkeypatch.setenv(codes_plan.DENSE_LINEARS_ENV, "0")
    model = tiny_model(LlamaConfig, tiny_tokenizer, hidden_size=256, intermediate_size=512)
    gguf_file = tmp_path / f"tiny-{quant}.gguf"
    write_gguf(gguf_file, model, tiny_tokenizer, quantize_linears=quant)
    folder = resolve_model_path(gguf_file)
    runner = ModelRunner(folder, EngineConfig(max_total_tokens=512, device="cpu"))
    assert "no dense copy" in runner.format.reason and runner.format.int_max_rows is None
    assert runner.decode_step is not None and runner.decode_step.every_pass
    assert not any(layer.mlp.down_proj.has_dense for layer in runner.model.layers)
    dense = EngineConfig(max_total_tokens=512, device="cpu", quantization="none", dtype="float32")
    reference = ModelRunner(folder, dense)
    runner.decode_step.max_rows = 2  # five decode rows: three groups, each on its own copies
    prompts = [tiny_tokenizer.encode(p + " " * i) for i, p in enumerate(PROMPTS + PROMPTS[:2])]
    got, want = [], []
    for each, rows in ((runner, got), (reference, want)):
        pairs = _segments(each.pool, prompts)
        # a mixed pass: the first prompt's prefill beside nothing else, then prefills of two
        # at once, then the rest; then every prompt's last token as decode rows together
        for batch in ([pairs[0][0]], [p[0] for p in pairs[1:3]], [p[0] for p in pairs[3:]]):
            out = each.forward(batch)
            rows += [out.rows(i) for i in range(len(batch))]
        out = each.forward([p[1] for p in pairs])
        rows += [out.rows(i) for i in range(len(pairs))]
    assert len(got) == len(want) == 2 * len(prompts)
    assert max(runs) <= 4 and max(len(p) for p in prompts) > 5  # the prompts were cut
    assert (sum(lane.nbytes for lane in runner.kv_lanes) > 0) == lanes_kept
    for ours, theirs in zip(got, want, strict=True):
        if theirs is None:  # a prefill that wanted no logits
            assert ours is None
            continue
        assert ours.shape == theirs.shape and torch.isfinite(ours).all()
        assert (ours - theirs).abs().max() <= 0.05 * theirs.abs().max()


@pytest.mark.parametrize("dense_linears", ["1", "0"])
def test_a_decode_step_giving_nan_at_load_is_never_used(
    tmp_path, tiny_tokenizer, monkeypatch, dense_linears
):
    """The onnxruntime step is probed at load: non-finite logits drop it for the torch step
    where dense linears exist, and refuse the load where the codes are the only copy."""
    from sgl_lite.backend.runner import ort_step
    from sgl_lite.backend.runner.weights import codes_plan
    from sgl_lite.backend.types import ForwardOutput

    def nan_logits(self, segments, pool, view):
        return ForwardOutput(torch.full((1, self.vocab), float("nan")), [(0, 1)])

    monkeypatch.setattr(ort_step.OrtDecodeStep, "_run", nan_logits)
    monkeypatch.setenv(codes_plan.DENSE_LINEARS_ENV, dense_linears)
    model = tiny_model(LlamaConfig, tiny_tokenizer, hidden_size=256, intermediate_size=512)
    gguf_file = tmp_path / "tiny-q4.gguf"
    write_gguf(gguf_file, model, tiny_tokenizer, quantize_linears="Q4_0")
    folder = resolve_model_path(gguf_file)
    config = EngineConfig(max_total_tokens=256, device="cpu", num_threads=NUM_THREADS)
    if dense_linears == "0":
        with pytest.raises(ModelLoadError, match="non-finite logits"):
            ModelRunner(folder, config)
        return
    runner = ModelRunner(folder, config)
    assert runner.decode_step is None and runner.pool.num_free == 256
    ids = tiny_tokenizer.encode(PROMPTS[0])
    slots = runner.pool.alloc(len(ids))
    seg = Segment(token_ids=ids, start=0, kv_slots=slots, logits_from=len(ids) - 1)
    assert torch.isfinite(runner.forward([seg]).logits).all()


def test_without_dense_linears_a_greedy_request_sent_again_repeats(
    tmp_path, tiny_tokenizer, monkeypatch
):
    """Every pass on the graph: the second run of each prompt hits the radix cache (its
    prompt is computed in other passes than the first time) and gives the same tokens, alone
    and with the others in flight."""
    from sgl_lite.backend.runner.weights import codes_plan

    monkeypatch.setenv(codes_plan.DENSE_LINEARS_ENV, "0")
    model = tiny_model(LlamaConfig, tiny_tokenizer, hidden_size=256, intermediate_size=512)
    gguf_file = tmp_path / "tiny-q4.gguf"
    write_gguf(gguf_file, model, tiny_tokenizer, quantize_linears="Q4_0")
    ids = [tiny_tokenizer.encode(p) for p in PROMPTS]
    with Engine(model_path=str(gguf_file), num_threads=NUM_THREADS, max_total_tokens=512) as engine:
        assert "no dense copy" in engine.runner.format.reason
        first = [o["output_ids"] for o in engine.generate(input_ids=ids, sampling_params=GREEDY)]
        again = [
            engine.generate(input_ids=one, sampling_params=GREEDY)["output_ids"] for one in ids
        ]
        batched = [o["output_ids"] for o in engine.generate(input_ids=ids, sampling_params=GREEDY)]
    assert first == again == batched


@pytest.mark.parametrize(("dtype", "rows"), [("float32", 32), ("bfloat16", 8)])
def test_beside_float32_dense_weights_the_graph_takes_every_decode_batch_in_groups(
    tmp_path, tiny_tokenizer, monkeypatch, dtype, rows
):
    """Beside float32 dense weights (a CPU without a bf16 GEMM) the onnxruntime graph takes
    decode batches of up to 32 rows in one run and larger ones in groups of that many, where the
    torch step's float32 linears lose to it; the groups' logits are the torch step's. Beside
    bf16 weights (oneDNN's GEMM) it takes up to 8, and a larger batch runs the torch step."""
    from sgl_lite.backend.runner.weights import codes_plan

    monkeypatch.setenv(codes_plan.DENSE_LINEARS_ENV, "1")  # the path that keeps dense linears
    model = tiny_model(LlamaConfig, tiny_tokenizer, hidden_size=256, intermediate_size=512)
    gguf_file = tmp_path / "tiny-q4.gguf"
    write_gguf(gguf_file, model, tiny_tokenizer, quantize_linears="Q4_0")
    config = EngineConfig(max_total_tokens=512, device="cpu", num_threads=NUM_THREADS, dtype=dtype)
    runner = ModelRunner(resolve_model_path(gguf_file), config)
    step = runner.decode_step
    assert step is not None and not step.every_pass, runner.format.describe()
    assert runner.format.dense_dtype == getattr(torch, dtype)
    decodes = [
        Segment(token_ids=[5], start=3, kv_slots=torch.arange(4 * i, 4 * i + 4), logits_from=0)
        for i in range(rows + 1)
    ]
    assert step.takes(decodes[:rows]) and not step.takes(decodes)
    assert step.takes_in_groups(decodes) is (dtype == "float32")
    if dtype != "float32":
        return
    step.max_rows = 2  # five decode rows: groups of 2, 2 and 1, each on its own copies
    prompts = [tiny_tokenizer.encode(p + " " * i) for i, p in enumerate(PROMPTS + PROMPTS[:2])]
    pairs = _segments(runner.pool, prompts)
    runner.forward([head for head, _ in pairs])
    got = runner.forward([tail for _, tail in pairs])
    assert sum(lane.nbytes > 0 for lane in runner.kv_lanes) == 3  # the three groups' copies
    assert runner.step_kv is not None and runner.step_kv.nbytes == 0  # one set at a time
    step.decode_groups = False  # the same rows on the torch step
    want = runner.forward([tail for _, tail in pairs])
    assert sum(lane.nbytes for lane in runner.kv_lanes) == 0  # released for the torch step's
    for i in range(len(pairs)):
        ours, theirs = got.rows(i), want.rows(i)
        assert ours is not None and theirs is not None and torch.isfinite(ours).all()
        assert (ours - theirs).abs().max() <= 0.05 * theirs.abs().max()
