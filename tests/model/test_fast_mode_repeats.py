"""The fast mode's repeat guarantee at the runner: a prompt's last token gets the same logits
whether the pass computed the whole prompt or only that token over a cached prefix, and that
token's K/V is the same too, so a greedy request sent twice repeats when the second hits the
radix cache. The scheduler marks a prompt's last chunk (`Segment.last_alone`) and the runner
computes its last token in a pass of single tokens (`split_final_rows`); without the split the
two passes run different kernels (the dense GEMM for the long pass, the int kernels for one
row) and part in the last bits."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from sgl_lite.backend.config import EngineConfig
from sgl_lite.backend.runner.model_loader import resolve_model_path
from sgl_lite.backend.runner.model_runner import ModelRunner
from sgl_lite.backend.runner.passes import merge_outputs, split_final_rows
from sgl_lite.backend.runner.weights import choose
from sgl_lite.backend.types import ForwardOutput, Segment
from tests.support import NUM_THREADS
from tests.support.gguf_files import write_gguf
from tests.support.tiny import build_tiny_tokenizer

PROMPT = 40  # more rows than the fast mode's int passes take: the prompt runs the dense GEMM


def _seg(
    ids: list[int], start: int, slots: torch.Tensor, logits_from: int, last_alone: bool = False
) -> Segment:
    return Segment(
        token_ids=ids,
        start=start,
        kv_slots=slots[: start + len(ids)],
        logits_from=logits_from,
        last_alone=last_alone,
    )


def test_split_keeps_each_segments_rows_and_sends_last_tokens_beside_decodes():
    slots = torch.arange(20)
    prompt = _seg(list(range(8)), 2, slots, 5, last_alone=True)  # rows 5..7 asked for
    decode = _seg([9], 12, slots, 0)
    middle = _seg(list(range(4)), 0, slots, 4)  # a middle chunk: no logits, not split
    jump = _seg(list(range(3)), 5, slots, 2)  # output tokens (jump-forward): not split
    head, tail = split_final_rows([prompt, decode, middle, jump])
    assert [(i, s.token_ids, s.start, s.logits_from) for i, s in head] == [
        (0, list(range(7)), 2, 5),
        (2, list(range(4)), 0, 4),
        (3, list(range(3)), 5, 2),
    ]
    assert [(i, s.token_ids, s.start, len(s.kv_slots)) for i, s in tail] == [
        (0, [7], 9, 10),
        (1, [9], 12, 13),
    ]
    assert split_final_rows([decode, middle, jump]) is None
    # each pass's rows go back to their segment, the earlier pass's first
    first = ForwardOutput(torch.tensor([[1.0], [2.0]]), [(0, 2), (2, 2), (2, 2)])
    second = ForwardOutput(torch.tensor([[3.0], [4.0]]), [(0, 1), (1, 2)])
    merged = merge_outputs(4, [(head, first), (tail, second)])
    assert merged.ranges == [(0, 3), (3, 4), (4, 4), (4, 4)]
    assert merged.logits is not None and merged.logits.flatten().tolist() == [1, 2, 3, 4]


@pytest.fixture(scope="module")
def q4_folder(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("repeat")
    tokenizer = build_tiny_tokenizer()
    config = LlamaConfig(
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        vocab_size=len(tokenizer),
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    gguf_file = tmp / "tiny-q4_0.gguf"
    write_gguf(gguf_file, model, tokenizer, quantize_linears="Q4_0")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SGL_LITE_CACHE", str(tmp / "cache"))
        return resolve_model_path(gguf_file)


def test_a_prompts_last_logits_and_kv_are_the_same_from_a_cached_prefix(q4_folder, monkeypatch):
    # The int kernels kept for passes of up to 16 rows whatever the load's timing: on a model
    # this small the kernels and the dense GEMM time alike (0.1 ms a probe pass), so the
    # measured choice flips between runs and machines.
    monkeypatch.setattr(
        choose,
        "_choose",
        lambda model, fmt, probes, config: choose.KernelChoice(
            next(iter(probes)), None, 16, "int kernels forced by the test", fmt.dense_dtype
        ),
    )
    runner = ModelRunner(
        q4_folder, EngineConfig(max_total_tokens=256, device="cpu", num_threads=NUM_THREADS)
    )
    fmt = runner.format
    assert not fmt.deterministic and fmt.int_kind == "int4", fmt.describe()
    assert fmt.int_max_rows is not None and fmt.int_max_rows < PROMPT
    ids = torch.randint(3, runner.vocab_size, (PROMPT,), generator=torch.Generator().manual_seed(2))
    ids_list = ids.tolist()
    pool = runner.pool
    whole = pool.alloc(PROMPT)
    cold = runner.forward([_seg(ids_list, 0, whole, PROMPT - 1, last_alone=True)]).rows(0)
    # the repeat: the first run's prefix K/V (as the radix cache keeps it), the last token alone
    again = pool.alloc(PROMPT)
    again[: PROMPT - 1] = whole[: PROMPT - 1]
    warm = runner.forward([_seg(ids_list[-1:], PROMPT - 1, again, 0)]).rows(0)
    assert cold is not None and warm is not None
    assert torch.equal(cold, warm)
    last, repeat = int(whole[-1]), int(again[-1])
    assert torch.equal(pool.k[:, last], pool.k[:, repeat])
    assert torch.equal(pool.v[:, last], pool.v[:, repeat])
