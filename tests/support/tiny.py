"""The tiny tokenizer trained in code and the tiny Llama shapes: the `unit` and `model` tiers'
stand-ins for SmolLM2, built in milliseconds and read from no file."""

from __future__ import annotations

from typing import Any

TINY_SYSTEM_PROMPT = "You are a tiny test assistant."
# SmolLM2's template shape (ChatML with a default system message), with our own system prompt.
TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\n" + TINY_SYSTEM_PROMPT + "<|im_end|>\\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
TINY_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
_TINY_CORPUS = (
    "The capital of France is Paris.",
    "Paris is a city in France.",
    "What is the capital of France?",
    "Q: Best pet?\nA: cat",
    "A dog, a cat and a hamster.",
    "Pick: red or blue",
    "Say: hello",
    TINY_SYSTEM_PROMPT,
)


def build_tiny_tokenizer() -> Any:
    """A byte-level BPE tokenizer (~340 tokens) trained here on a few sentences, wrapped as a
    transformers tokenizer with a ChatML chat template: any text encodes (bytes), frequent
    words such as " Paris" are one token, and nothing is read from disk."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=360,
        special_tokens=list(TINY_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(list(_TINY_CORPUS) * 20, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token="<|im_start|>", eos_token="<|im_end|>"
    )
    tokenizer.chat_template = TINY_CHAT_TEMPLATE
    return tokenizer


# A tiny random Llama whose vocabulary holds the tiny tokenizer's ids.
TINY_LLAMA = dict(
    vocab_size=384,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
)


DECODE_VOCAB = 211  # the decode-step tests' vocabulary: TINY_LLAMA's shapes, fewer ids


def tiny_runner(model_type: str = "llama", **overrides: Any) -> Any:
    """A ModelRunner over a tiny random model of `model_type` (TINY_LLAMA's shapes and
    `overrides`, DECODE_VOCAB ids, seed 0; biases, where the family has them, random too) and
    a 400-slot pool, built without a model folder, for tests that drive decode steps."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from sgl_lite.backend.kvcache.kv_pool import KVPool
    from sgl_lite.backend.runner.model_runner import ModelRunner
    from sgl_lite.backend.runner.models import build_model
    from sgl_lite.backend.runner.models.attention import head_dim_of

    config = AutoConfig.for_model(
        model_type, **{**TINY_LLAMA, "vocab_size": DECODE_VOCAB, **overrides}
    )
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if name.endswith(("bias", "q_norm.weight", "k_norm.weight")):
                param.copy_(torch.randn_like(param) * 0.5 + (0 if "bias" in name else 1))
    model = build_model(config, 128)
    model.load_hf_state_dict(hf.state_dict())
    runner = ModelRunner.__new__(ModelRunner)
    runner.model, runner.device = model.eval(), torch.device("cpu")
    runner.context_length, runner.vocab_size = 128, config.vocab_size
    runner.pool = KVPool(
        num_layers=2, num_slots=400, num_kv_heads=2, head_dim=head_dim_of(config), scratch_slots=1
    )
    return runner


def prefill_random(runner: Any, lengths: list[int]) -> list[tuple[list[int], Any]]:
    """Prefills one request per length with seeded random ids, each drawn one id longer (the
    next decode input); returns (ids, slots) per request."""
    import torch

    from sgl_lite.backend.types import Segment

    gen = torch.Generator().manual_seed(1)
    seqs = []
    for n in lengths:
        ids = torch.randint(0, DECODE_VOCAB, (n + 1,), generator=gen).tolist()
        slots = runner.pool.alloc(n + 1)
        runner.forward([Segment(token_ids=ids[:n], start=0, kv_slots=slots[:n], logits_from=n)])
        seqs.append((ids, slots))
    return seqs


def prefill_branches(runner: Any, prefix_len: int, own: list[int], extra: int) -> list[Any]:
    """A prompt of `prefix_len` tokens prefilled once and requests branching off it (each
    prefilled with `own[i]` tokens of its own); returns per request (tokens held, slots) with
    room for `extra` decode tokens."""
    import torch

    from sgl_lite.backend.types import Segment

    (_, prefix_slots), *_ = prefill_random(runner, [prefix_len])
    prefix_slots = prefix_slots[:prefix_len]
    gen = torch.Generator().manual_seed(3)
    seqs = []
    for n in own:
        ids = torch.randint(0, DECODE_VOCAB, (n,), generator=gen).tolist()
        slots = torch.cat([prefix_slots, runner.pool.alloc(n + extra)])
        seg = Segment(
            token_ids=ids, start=prefix_len, kv_slots=slots[: prefix_len + n], logits_from=n
        )
        runner.forward([seg])
        seqs.append((prefix_len + n, slots))
    return seqs
