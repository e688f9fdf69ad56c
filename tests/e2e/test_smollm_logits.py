"""The embedded SmolLM2 outside the engine: its float32 logits against transformers', and both
weight modes (fast, deterministic) on the file's Q4_1 codes against float32."""

from __future__ import annotations

from typing import NamedTuple

import pytest
import torch

from sgl_lite.backend.config import EngineConfig
from sgl_lite.backend.runner.decode_attention import DECODE_OVER_COPIES_MIN_ROWS
from sgl_lite.backend.runner.model_runner import ModelRunner
from sgl_lite.backend.runner.models.attention import Attention
from sgl_lite.backend.runner.weights import quant
from sgl_lite.backend.runner.weights.choose import CROSSOVER_ROWS
from sgl_lite.backend.runner.weights.cpu import rows_invariant
from sgl_lite.backend.types import Segment
from tests.support.runner_logits import (
    chunked_logits,
    decided_disagreements,
    decoded_logits,
    perplexity,
)

# A fixed natural text for perplexity (no repetition, so the figure means something).
PPL_TEXT = (
    "The lighthouse keeper climbed the narrow stairs every evening at dusk, carrying a can of "
    "oil and a cloth for the lens. For thirty years he had watched ships pass the rocky point, "
    "some heading north with timber, others returning south with coal and grain. In winter the "
    "storms came quickly, and the waves broke over the lower windows of the tower. He kept a "
    "logbook in which he recorded the weather, the ships he saw, and the hours the lamp burned. "
    "When the government replaced the lamp with an automatic light, he was asked to leave. He "
    "moved to a small house in the village, but each night he still walked to the harbour wall "
    "to see the beam sweep across the water, and he wrote the time in his book as before. "
    "Children from the school sometimes followed him, asking about shipwrecks and sea monsters, "
    "and he told them about the night a fishing boat lost its engine near the reef."
)


def _runner(folder, **kwargs) -> ModelRunner:
    return ModelRunner(folder, EngineConfig(max_total_tokens=1024, device="cpu", **kwargs))


def test_smollm_top1_tokens_match_transformers_on_64_token_prompt(
    smollm_folder, hf_smollm, smollm_tokenizer
):
    config = EngineConfig(max_total_tokens=256, device="cpu", dtype="float32", quantization="none")
    runner = ModelRunner(smollm_folder, config)
    text = "The quick brown fox jumps over the lazy dog. " * 8
    ids = smollm_tokenizer.encode(text)[:64]
    assert len(ids) == 64
    slots = runner.pool.alloc(64)
    ours = runner.forward([Segment(token_ids=ids, start=0, kv_slots=slots, logits_from=0)]).logits
    with torch.no_grad():
        theirs = hf_smollm(torch.tensor([ids])).logits[0].float()
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1))
    assert (ours - theirs).abs().max().item() < 1e-3


def test_deterministic_mode_runs_int_kernels_only_where_they_are_row_invariant(smollm_folder):
    """The deterministic mode's cache on/off guarantee rests on the kernels' row invariance,
    checked at load; where it does not hold the mode is refused, naming the kernel."""
    torch.manual_seed(0)
    weight = torch.randn(96, 128) * 0.05
    if rows_invariant(quant.Int4Weight.from_float(weight)):
        runner = _runner(smollm_folder, enable_deterministic_inference=True)
        assert runner.format.int_kind == "int4", runner.format.describe()
        assert runner.format.int_max_rows is None  # every pass
    else:
        with pytest.raises(ValueError, match="int4 kernel"):
            _runner(smollm_folder, enable_deterministic_inference=True)


class Float32Reference(NamedTuple):
    """The embedded model in float32 on the two texts of the mode tests: a 64-token prompt and
    PPL_TEXT, with the reference's logits of the first and perplexity of the second."""

    prompt: list[int]
    logits: torch.Tensor
    text: list[int]
    perplexity: float


@pytest.fixture(scope="module")
def float32_reference(smollm_folder, smollm_tokenizer) -> Float32Reference:
    """Float32Reference, computed once for both modes (each prefill, whole)."""
    reference = _runner(smollm_folder, dtype="float32", quantization="none")
    prompt = smollm_tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 8)[:64]
    text = smollm_tokenizer.encode(PPL_TEXT)
    ppl = perplexity(chunked_logits(reference, text, chunk=len(text)), text)
    return Float32Reference(prompt, chunked_logits(reference, prompt, chunk=64), text, ppl)


@pytest.mark.parametrize("deterministic", [False, True], ids=["fast", "deterministic"])
def test_embedded_model_matches_float32_top1_and_perplexity_in_both_modes(
    smollm_folder, float32_reference, deterministic
):
    """The default (fast) mode and the deterministic one, both on the file's Q4_1 codes, agree
    with float32's top-1 on every next token it decides (`decided_disagreements`: 62 of the
    fixed prompt's 64) and come within 1 % of its perplexity, on the passes
    that run the int kernels (decode) and on those that do not (in the fast mode, a prefill
    longer than any crossover the load can measure: on an AVX2 CPU the int kernel beats the
    float32 GEMM up to 64 rows)."""
    ours_runner = _runner(smollm_folder, enable_deterministic_inference=deterministic)
    fmt = ours_runner.format
    assert fmt.int_kind == "int4", fmt.describe()  # the file's own Q4_1
    kept = ours_runner.model.layers[0].mlp.down_proj.has_dense
    assert kept is not deterministic  # the fast mode keeps the dense weights for long passes
    prompt, ref, text, ppl_ref = float32_reference
    assert len(text) > max(CROSSOVER_ROWS)
    assert fmt.runs_int(1) and fmt.runs_int(len(text)) is deterministic

    assert len(prompt) == 64 and ref.shape[0] == 64
    for chunk in (64, 1):  # one prefill, then decode steps
        ours = chunked_logits(ours_runner, prompt, chunk)
        decided, differ = decided_disagreements(ours, ref)
        assert decided >= 62 and not differ, f"chunk {chunk}: top-1 differs at {differ}"

    for chunk in (len(text), 1):  # one prefill; decode steps
        ppl = perplexity(chunked_logits(ours_runner, text, chunk), text)
        assert abs(ppl / ppl_ref - 1) <= 0.01, f"chunk {chunk}: ppl {ppl:.3f} vs {ppl_ref:.3f}"


def test_decode_steps_of_eight_rows_keep_the_fast_modes_bounds(
    smollm_folder, float32_reference, monkeypatch
):
    """A torch decode step of DECODE_OVER_COPIES_MIN_ROWS rows attends over the decode copies'
    whole capacity with bf16 scores; every row keeps the fast mode's bounds against float32
    (top-1 on every decided next token, perplexity within 1 %). In bf16 asked for, as the fast
    mode runs on a CPU with a bf16 GEMM: an AVX2 CPU's default float32 attends with SDPA."""
    monkeypatch.setenv("SGL_LITE_DISABLE_ORT_STEP", "1")  # the torch step, whatever the batch
    config = EngineConfig(max_total_tokens=4096, device="cpu", dtype="bfloat16")
    runner = ModelRunner(smollm_folder, config)
    taken = []
    monkeypatch.setattr(
        Attention,
        "_decode_over_copies",
        lambda self, *args, _run=Attention._decode_over_copies: (
            taken.append(1) or _run(self, *args)
        ),
    )
    prompt, ref, text, ppl_ref = float32_reference
    rows = DECODE_OVER_COPIES_MIN_ROWS
    for row in decoded_logits(runner, prompt, rows):
        decided, differ = decided_disagreements(row, ref)
        assert decided >= 62 and not differ, f"top-1 differs at {differ}"
    assert taken  # the steps attended over the copies
    for row in decoded_logits(runner, text, rows):
        ppl = perplexity(row, text)
        assert abs(ppl / ppl_ref - 1) <= 0.01, f"ppl {ppl:.3f} vs {ppl_ref:.3f}"


def test_decode_rows_on_a_shared_prompt_read_it_once_with_the_padded_passes_logits(
    smollm_folder, smollm_tokenizer, monkeypatch
):
    """Twelve requests branching off one 64-token prompt: the decode step that reads the prompt
    once for all of them (models/shared_prefix.py) gives the logits of the step that reads it
    per row, in float32 on the real model (GQA 9/3, 30 layers)."""
    monkeypatch.setenv("SGL_LITE_DISABLE_ORT_STEP", "1")  # the torch step, whatever the batch
    # float32 throughout: an int kernel's bf16 input would round the two passes' tiny
    # differences apart
    runner = _runner(smollm_folder, dtype="float32", quantization="none")
    assert runner.shared_prefixes and not runner.format.deterministic
    prompt = smollm_tokenizer.encode(PPL_TEXT)[:64]
    slots = runner.pool.alloc(64)
    runner.forward([Segment(token_ids=prompt, start=0, kv_slots=slots, logits_from=64)])
    steps = []
    for i in range(12):
        own = runner.pool.alloc(3)
        seq = torch.cat([slots, own])
        runner.forward(
            [Segment(token_ids=[10 + i, 20 + i], start=64, kv_slots=seq[:66], logits_from=2)]
        )
        steps.append(Segment(token_ids=[30 + i], start=66, kv_slots=seq, logits_from=0))
    pool = (runner.pool.k.clone(), runner.pool.v.clone())
    runner.shared_prefixes = False
    padded = runner.forward(steps).logits
    runner.pool.k.copy_(pool[0])
    runner.pool.v.copy_(pool[1])
    runner.shared_prefixes = True
    meta = runner._metadata(steps)
    assert meta.groups[0].shared is not None  # the cut is made for this batch
    cascaded = runner.forward(steps).logits
    assert (cascaded - padded).abs().max().item() < 1e-3, (cascaded - padded).abs().max()
    assert torch.equal(cascaded.argmax(-1), padded.argmax(-1))
