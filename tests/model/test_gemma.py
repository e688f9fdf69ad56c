"""Gemma, Gemma 2 and Gemma 3 text against transformers on tiny random configs: logits of a
prefill, a chunk over a cached prefix and a mixed batch; greedy tokens through `Engine` with the
radix cache on and off; sliding windows shorter than the prompt and than a shared prefix."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, Gemma2Config, Gemma3TextConfig, GemmaConfig

from sgl_lite.backend.engine import Engine
from sgl_lite.backend.kvcache.kv_pool import KVPool
from sgl_lite.backend.runner.decode_graphs import DecodeGraphs
from sgl_lite.backend.runner.model_runner import ModelRunner
from sgl_lite.backend.runner.models.gemma import GemmaForCausalLM
from sgl_lite.backend.runner.models.llama import head_dim_of
from sgl_lite.backend.types import Segment
from tests.support import NUM_THREADS

WINDOW = 8
SMALL = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=256,
    # Larger than the default 0.02, so that scores and logits reach the soft caps below.
    initializer_range=0.1,
    eos_token_id=2,
    bos_token_id=1,
    pad_token_id=0,
)
GEMMA3_ROPE = {
    "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1_000_000.0},
    "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
}


def configs(vocab_size: int) -> dict[str, object]:
    """One config per family; windows of 8 tokens, caps low enough to bite."""
    tiny = dict(SMALL, vocab_size=vocab_size)
    return {
        "gemma": GemmaConfig(**tiny),
        "gemma2": Gemma2Config(
            **tiny,
            query_pre_attn_scalar=24,
            sliding_window=WINDOW,
            attn_logit_softcapping=1.0,
            final_logit_softcapping=2.0,
        ),
        "gemma3": Gemma3TextConfig(
            **tiny,
            query_pre_attn_scalar=24,
            sliding_window=WINDOW,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"]
            + ["sliding_attention"],
            rope_parameters={k: dict(v) for k, v in GEMMA3_ROPE.items()},
            tie_word_embeddings=False,
        ),
    }


FAMILIES = ("gemma", "gemma2", "gemma3")


def hf_model(config) -> torch.nn.Module:
    """transformers' model on fresh random weights, eager so caps and windows apply."""
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()


class TinyRunner:
    """Our model plus a pool, driven by segments the way the engine drives it."""

    def __init__(self, config) -> None:
        self.hf = hf_model(config)
        self.model = GemmaForCausalLM(config, config.max_position_embeddings)
        self.model.load_hf_state_dict(self.hf.state_dict())
        self.pool = KVPool(
            num_layers=config.num_hidden_layers,
            num_slots=512,
            num_kv_heads=config.num_key_value_heads,
            head_dim=head_dim_of(config),
        )
        runner = ModelRunner.__new__(ModelRunner)
        runner.model, runner.pool, runner.device = self.model, self.pool, torch.device("cpu")
        self.runner = runner

    def hf_logits(self, ids: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return self.hf(torch.tensor([ids])).logits[0].float()


def random_ids(n: int, seed: int, vocab: int = 211) -> list[int]:
    return torch.randint(3, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("family", FAMILIES)
def test_prefill_logits_match_transformers(family):
    tiny = TinyRunner(configs(211)[family])
    ids = random_ids(40, 1)  # 5x the window
    slots = tiny.pool.alloc(len(ids))
    ours = tiny.runner.forward(
        [Segment(token_ids=ids, start=0, kv_slots=slots, logits_from=0)]
    ).logits
    assert (ours - tiny.hf_logits(ids)).abs().max().item() <= 1e-4


@pytest.mark.parametrize("family", FAMILIES)
def test_chunks_over_a_cached_prefix_and_a_mixed_batch_match_transformers(family):
    """A chunk over a cached prefix, a fresh prompt and two decodes, one past the window."""
    tiny = TinyRunner(configs(211)[family])
    seqs = [random_ids(n, 10 + n) for n in (30, 17, 25, 6)]
    cached = [12, 0, 24, 5]  # tokens already in the pool before the mixed pass
    all_slots = [tiny.pool.alloc(len(s)) for s in seqs]
    warmup = [
        Segment(token_ids=s[:c], start=0, kv_slots=sl[:c], logits_from=c)
        for s, c, sl in zip(seqs, cached, all_slots)
        if c
    ]
    tiny.runner.forward(warmup)
    segments = [
        Segment(token_ids=s[c:], start=c, kv_slots=sl, logits_from=0)
        for s, c, sl in zip(seqs, cached, all_slots)
    ]
    output = tiny.runner.forward(segments)
    for i, (seq, c) in enumerate(zip(seqs, cached)):
        expected = tiny.hf_logits(seq)[c:]
        assert (output.rows(i) - expected).abs().max().item() <= 1e-4, f"request {i}"


def test_the_window_and_the_soft_caps_change_the_logits():
    """The configs above exercise what they claim: without the window or caps, logits differ."""
    config = configs(211)["gemma2"]
    tiny = TinyRunner(config)
    ids = random_ids(40, 1)
    base = tiny.runner.forward(
        [Segment(token_ids=ids, start=0, kv_slots=tiny.pool.alloc(40), logits_from=0)]
    ).logits
    for change in ({"sliding_window": None}, {"softcap": None}, {"final_softcap": None}):
        model = GemmaForCausalLM(config, 256)
        model.load_hf_state_dict(tiny.hf.state_dict())
        if "sliding_window" in change:
            model.sliding_window = None
        if "softcap" in change:
            for layer in model.layers:
                layer.self_attn.softcap = None
                layer.self_attn.scale = config.query_pre_attn_scalar**-0.5
        if "final_softcap" in change:
            model.final_softcap = None
        tiny.runner.model = model
        other = tiny.runner.forward(
            [Segment(token_ids=ids, start=0, kv_slots=tiny.pool.alloc(40), logits_from=0)]
        ).logits
        assert (other - base).abs().max().item() > 1e-2, change


def test_bidirectional_attention_is_refused_naming_the_field():
    config = Gemma3TextConfig(**dict(SMALL, vocab_size=211), use_bidirectional_attention=True)
    with pytest.raises(ValueError, match="use_bidirectional_attention"):
        GemmaForCausalLM(config, 64)


def test_weights_that_do_not_fit_are_a_clear_error():
    config = configs(211)["gemma3"]
    state = dict(hf_model(config).state_dict())
    state.pop("model.layers.1.self_attn.k_norm.weight")
    with pytest.raises(ValueError, match="k_norm"):
        GemmaForCausalLM(config, 64).load_hf_state_dict(state)
    state = dict(hf_model(config).state_dict(), **{"model.extra.weight": torch.zeros(2)})
    with pytest.raises(ValueError, match="model.extra.weight"):
        GemmaForCausalLM(config, 64).load_hf_state_dict(state)


def hf_greedy(hf, ids: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return out[0, len(ids) :].tolist()


def until_eos(tokens: list[int], eos: int = 2) -> list[int]:
    """min_new_tokens in transformers masks EOS; ignore_eos here may emit it: compare up to it."""
    return tokens[: next((i for i, t in enumerate(tokens) if t == eos), len(tokens))]


@pytest.mark.parametrize("family", FAMILIES)
def test_engine_greedy_tokens_match_transformers_generate(tmp_path, family, smollm_tokenizer):
    """Several prompts, the longest 40 tokens (5 windows), decoding past the window, batched."""
    hf = hf_model(configs(smollm_tokenizer.vocab_size)[family])
    hf.save_pretrained(tmp_path)
    smollm_tokenizer.save_pretrained(tmp_path)
    long = "The quick brown fox jumps over the lazy dog while the cat sleeps. " * 4
    prompts = [
        smollm_tokenizer.encode("A tiny random model says"),
        smollm_tokenizer.encode(long)[:40],
        smollm_tokenizer.encode("Sliding windows forget"),
    ]
    assert len(prompts[1]) == 40
    new = 12
    expected = [until_eos(hf_greedy(hf, ids, new)) for ids in prompts]
    params = {"temperature": 0, "max_new_tokens": new, "ignore_eos": True}
    # Cache on, off, and on with prompts cut into 16-token chunks (2 windows).
    for disable, chunk in ((False, 2048), (True, 2048), (False, 16)):
        with Engine(
            model_path=str(tmp_path),
            num_threads=NUM_THREADS,
            max_total_tokens=512,
            disable_radix_cache=disable,
            chunked_prefill_size=chunk,
            dtype="float32",
        ) as engine:
            batched = engine.generate(input_ids=prompts, sampling_params=params)
            alone = [engine.generate(input_ids=ids, sampling_params=params) for ids in prompts]
        for want, got, again in zip(expected, batched, alone):
            assert got["output_ids"][: len(want)] == want, f"cache off: {disable}, chunk {chunk}"
            assert again["output_ids"] == got["output_ids"]


@pytest.mark.parametrize("family", ("gemma2", "gemma3"))
def test_prefix_shared_through_the_cache_is_longer_than_the_window(
    tmp_path, family, smollm_tokenizer
):
    """Two requests share a 30-token prefix (almost 4 windows): the second reads it from the
    radix cache and still decodes what transformers does from scratch."""
    hf = hf_model(configs(smollm_tokenizer.vocab_size)[family])
    hf.save_pretrained(tmp_path)
    smollm_tokenizer.save_pretrained(tmp_path)
    prefix = smollm_tokenizer.encode("In a village by the sea there lived an old sailor who " * 3)
    prefix = prefix[:30]
    prompts = [prefix + smollm_tokenizer.encode(t) for t in (" told tales", " sang songs at night")]
    new = 12
    expected = [until_eos(hf_greedy(hf, ids, new)) for ids in prompts]
    params = {"temperature": 0, "max_new_tokens": new, "ignore_eos": True}
    with Engine(
        model_path=str(tmp_path), num_threads=NUM_THREADS, max_total_tokens=512, dtype="float32"
    ) as engine:
        first = engine.generate(input_ids=prompts[0], sampling_params=params)
        second = engine.generate(input_ids=prompts[1], sampling_params=params)
        cached = second["meta_info"].get("cached_tokens")
    assert first["output_ids"][: len(expected[0])] == expected[0]
    assert second["output_ids"][: len(expected[1])] == expected[1]
    assert cached is not None and cached >= len(prefix) > WINDOW


def test_gemma_decode_through_the_static_graph_buffers_equals_the_eager_step():
    """Gemma (no sliding layers) keeps CUDA-graph decoding: its step, run eagerly on the graphs'
    padded buffers, gives the ordinary forward's logits."""
    config = configs(211)["gemma"]
    tiny = TinyRunner(config)
    runner = tiny.runner
    runner.context_length, runner.vocab_size = 128, config.vocab_size
    runner.pool = KVPool(
        num_layers=config.num_hidden_layers,
        num_slots=400,
        num_kv_heads=config.num_key_value_heads,
        head_dim=head_dim_of(config),
        scratch_slots=1,
    )
    graphs = DecodeGraphs(runner, capture=False)
    seqs = []
    for n, seed in ((5, 1), (40, 2), (17, 3)):
        ids, slots = random_ids(n + 1, seed), runner.pool.alloc(n + 1)
        runner.forward([Segment(token_ids=ids[:n], start=0, kv_slots=slots[:n], logits_from=n)])
        seqs.append((ids, slots))
    step = [
        Segment(token_ids=ids[-1:], start=len(ids) - 1, kv_slots=s, logits_from=0)
        for ids, s in seqs
    ]
    eager = runner.forward(step)
    replayed = graphs.run(step)  # the batch-4 buffers, one padding row
    assert replayed is not None and replayed.ranges == eager.ranges
    assert (replayed.logits - eager.logits).abs().max() <= 1e-5
    expected = torch.stack([tiny.hf_logits(ids)[-1] for ids, _ in seqs])
    assert (replayed.logits - expected).abs().max() <= 1e-4
