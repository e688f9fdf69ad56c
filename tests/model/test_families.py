"""Every decoder family against transformers on tiny random checkpoints saved as HF folders.

Each family's folder (`save_pretrained`, tiny tokenizer) is loaded the way users load it: by
`ModelRunner(folder, ...)` for the logits checks (the engine's own meta-device build and
checked weight loading) and by `Engine(model_path=folder)` for greedy generation.
"""

from __future__ import annotations

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    GraniteConfig,
    LlamaConfig,
    MistralConfig,
    Olmo2Config,
    Phi3Config,
    Qwen2Config,
    Qwen3Config,
)

from sgl_lite.backend.config import EngineConfig
from sgl_lite.backend.engine import Engine
from sgl_lite.backend.runner.model_runner import ModelRunner
from sgl_lite.backend.runner.models import FAMILIES, SUPPORTED_MODEL_TYPES
from sgl_lite.backend.runner.models.attention import head_dim_of
from sgl_lite.backend.runner.models.rope import RotaryEmbedding
from sgl_lite.backend.types import Segment
from tests.support import NUM_THREADS

VOCAB = 384  # the tiny tokenizer's ~360 tokens, rounded up
TINY = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    bos_token_id=1,
    eos_token_id=2,
)
ORIGINAL = 64  # pretraining length of the scaled-RoPE configs; every test sequence fits in it
LONGROPE = {
    "rope_type": "longrope",
    # partial_rotary_factor 0.5 of head_dim 16: 8 rotated dims, 4 frequencies
    "short_factor": [1.0, 1.3, 1.7, 2.5],
    "long_factor": [1.5, 3.0, 6.0, 12.0],
}

CONFIGS = {
    "llama3_rope": lambda: LlamaConfig(
        **TINY,
        tie_word_embeddings=True,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": ORIGINAL,
        },
    ),
    "llama_yarn": lambda: LlamaConfig(
        **TINY,
        rope_scaling={
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": ORIGINAL,
        },
    ),
    "llama_linear": lambda: LlamaConfig(
        **TINY, rope_scaling={"rope_type": "linear", "factor": 2.0}
    ),
    "mistral": lambda: MistralConfig(**TINY, sliding_window=128),
    "qwen2": lambda: Qwen2Config(**TINY, tie_word_embeddings=True),
    "qwen3": lambda: Qwen3Config(**TINY, head_dim=24, tie_word_embeddings=True),
    "olmo2": lambda: Olmo2Config(**TINY),
    "granite": lambda: GraniteConfig(
        **TINY,
        embedding_multiplier=6.0,
        residual_multiplier=0.3,
        attention_multiplier=0.4,
        logits_scaling=4.0,
        tie_word_embeddings=True,
    ),
    "phi3_longrope_partial": lambda: Phi3Config(
        **TINY,
        partial_rotary_factor=0.5,
        original_max_position_embeddings=ORIGINAL,
        rope_scaling=dict(LONGROPE),
        pad_token_id=0,
    ),
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def family(request, tmp_path_factory, tiny_tokenizer):
    """(name, transformers model, saved folder) of one family's tiny random checkpoint."""
    config = CONFIGS[request.param]()
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():  # norms start at ones: random ones catch a swapped or unread norm
        for name, param in hf.named_parameters():
            if "norm" in name:
                param.copy_(1 + 0.2 * torch.randn_like(param))
    folder = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(folder)
    tiny_tokenizer.save_pretrained(folder)
    return request.param, hf, folder


def hf_logits(hf, ids: list[int]) -> torch.Tensor:
    """transformers' float32 logits (n, vocab) over the whole sequence `ids`."""
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].float()


def runner_for(folder) -> ModelRunner:
    """The engine's runner on the folder, float32, dense."""
    config = EngineConfig(max_total_tokens=512, device="cpu", dtype="float32", quantization="none")
    return ModelRunner(folder, config)


def random_ids(n: int, seed: int) -> list[int]:
    return torch.randint(3, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_every_registered_family_is_tested_here():
    tested = {CONFIGS[name]().model_type for name in CONFIGS}
    # Gemma's own block is tested in test_gemma.py
    assert tested >= set(SUPPORTED_MODEL_TYPES) - {"gemma", "gemma2", "gemma3_text"}
    assert set(FAMILIES) == set(SUPPORTED_MODEL_TYPES)


def test_prefill_logits_match_transformers(family):
    _, hf, folder = family
    runner = runner_for(folder)
    ids = random_ids(40, seed=1)
    slots = runner.pool.alloc(len(ids))
    ours = runner.forward([Segment(token_ids=ids, start=0, kv_slots=slots, logits_from=0)])
    assert (ours.logits - hf_logits(hf, ids)).abs().max().item() <= 1e-4


def test_chunked_prefill_and_mixed_decode_batch_match_transformers(family):
    """One pass holding a chunk over a cached prefix, a fresh prompt and two decodes."""
    _, hf, folder = family
    runner = runner_for(folder)
    seqs = [random_ids(n, seed=10 + n) for n in (33, 17, 25, 48)]
    cached = [12, 0, 24, 47]  # tokens in the pool before the mixed pass; the last two decode
    all_slots = [runner.pool.alloc(len(s)) for s in seqs]
    runner.forward(
        [
            Segment(token_ids=s[:c], start=0, kv_slots=sl[:c], logits_from=c)
            for s, c, sl in zip(seqs, cached, all_slots)
            if c
        ]
    )
    output = runner.forward(
        [
            Segment(token_ids=s[c:], start=c, kv_slots=sl, logits_from=0)
            for s, c, sl in zip(seqs, cached, all_slots)
        ]
    )
    for i, (seq, c) in enumerate(zip(seqs, cached)):
        assert (output.rows(i) - hf_logits(hf, seq)[c:]).abs().max().item() <= 1e-4, i


def test_greedy_tokens_match_transformers_generate_with_cache_on_and_off(family, tiny_tokenizer):
    _, hf, folder = family
    prompts = [
        "The capital of France is",
        "The capital of France is Paris. What is",  # shares a prefix with the first
        "Pick: red or blue",
    ]
    prompt_ids = [tiny_tokenizer.encode(p) for p in prompts]
    expected = []
    for ids in prompt_ids:
        with torch.no_grad():
            out = hf.generate(
                torch.tensor([ids]), max_new_tokens=8, min_new_tokens=8, do_sample=False
            )
        expected.append(out[0, len(ids) :].tolist())
    params = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}
    for disable in (False, True):
        with Engine(
            model_path=str(folder),
            num_threads=NUM_THREADS,
            max_total_tokens=512,
            disable_radix_cache=disable,
            dtype="float32",
        ) as engine:
            alone = [engine.generate(input_ids=ids, sampling_params=params) for ids in prompt_ids]
            batched = engine.generate(input_ids=prompt_ids, sampling_params=params)
        for want, one, many in zip(expected, alone, batched):
            # min_new_tokens masks EOS in transformers; ignore_eos may emit it: compare up to it.
            n = next((i for i, t in enumerate(want) if t == 2), len(want))
            assert one["output_ids"][:n] == want[:n]
            assert many["output_ids"] == one["output_ids"]


def test_longrope_tables_past_the_pretraining_length_are_transformers_long_factors():
    """Past `original_max_position_embeddings` a position takes the long factors, as
    transformers does for a sequence that long (shorter ones are covered above)."""
    config = CONFIGS["phi3_longrope_partial"]()
    hf = AutoModelForCausalLM.from_config(config).eval()
    ours = RotaryEmbedding(config, head_dim_of(config), config.max_position_embeddings)
    positions = torch.arange(ORIGINAL + 20)
    cos, sin = hf.model.rotary_emb(torch.zeros(1), positions[None])  # seq_len > ORIGINAL: long
    long = positions >= ORIGINAL
    assert ours.cos.shape[-1] == 8  # partial rotary: 8 of 16 dims
    torch.testing.assert_close(ours.cos[positions][long], cos[0][long], atol=1e-6, rtol=0)
    half = ours.sin.shape[-1] // 2  # ours holds the first half negated (see apply_rope)
    torch.testing.assert_close(
        ours.sin[positions][long, half:], sin[0][long, half:], atol=1e-6, rtol=0
    )
    short_cos, _ = hf.model.rotary_emb(torch.zeros(1), positions[None, :ORIGINAL])
    torch.testing.assert_close(ours.cos[:ORIGINAL], short_cos[0], atol=1e-6, rtol=0)
