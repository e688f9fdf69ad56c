"""GGUF files of every served family beyond Llama and Qwen (Phi-3, Gemma 1/2/3, Granite,
OLMo 2): a tiny random model written as llama.cpp lays it out (its tensor names, Gemma's
`1 + w` norms, Phi-3's fused q/k/v and gate/up, Granite's permuted q/k rows, its metadata keys)
loads with our reader to the original weights, and our runner's logits on it are the original
model's. Gemma 1, Granite and OLMo 2 get a config of our own from the metadata (transformers
reads none for them), so their cases hold that config against the original too."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    Gemma2Config,
    Gemma3TextConfig,
    GemmaConfig,
    GraniteConfig,
    LlamaConfig,
    MistralConfig,
    Olmo2Config,
    Phi3Config,
    Qwen2Config,
    Qwen3Config,
)

from sgl_lite.backend.config import EngineConfig
from sgl_lite.backend.runner.model_loader import (
    GGUF_ARCHITECTURES,
    ModelLoadError,
    load_config,
    load_state_dict,
    resolve_model_path,
)
from sgl_lite.backend.runner.model_runner import ModelRunner
from sgl_lite.backend.runner.models import SUPPORTED_MODEL_TYPES
from sgl_lite.backend.runner.weights.gguf_config import OWN_CONFIG, transformers_config
from sgl_lite.backend.runner.weights.gguf_header import read_header
from sgl_lite.backend.runner.weights.gguf_tensors import read_quantized
from sgl_lite.backend.types import Segment
from tests.support.gguf_files import GRANITE_MULTIPLIERS, TINY_GGUF, write_gguf

# Conversions go to each test's own folder (tests/conftest.py), never the user's cache.
pytestmark = pytest.mark.usefixtures("private_cache")

# Longer than the Gemma cases' sliding window (8), so the window is exercised.
PROMPT = "The capital of France is Paris, a city in France. Q: Best pet?\nA: a dog and a cat"


class Case:
    """One family's file: its config, how llama.cpp names the architecture, the block format
    of its linears (None: float32), and whether transformers' own GGUF loader reads back all
    of the config (it reads no Phi-3 partial rotary factor and no Gemma 2 soft-capping, and no
    config at all for Gemma 1, Granite and OLMo 2)."""

    def __init__(self, config_cls, arch, quant=None, transformers_reads_all=True, **overrides):
        self.config_cls, self.arch, self.quant = config_cls, arch, quant
        self.transformers_reads_all = transformers_reads_all and arch not in OWN_CONFIG
        self.overrides = overrides


CASES = {
    "phi3-f32": Case(Phi3Config, "phi3", pad_token_id=0),
    # fused qkv / gate_up in Q8_0: read dense (no codes for them), the rest as codes
    "phi3-q8_0": Case(Phi3Config, "phi3", "Q8_0", pad_token_id=0, tie_word_embeddings=False),
    # Phi-4-mini rotates 3/4 of each head: the file says it in rope.dimension_count
    "phi3-partial-rotary": Case(
        Phi3Config,
        "phi3",
        transformers_reads_all=False,
        pad_token_id=0,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.75,
        },
    ),
    # Phi-3-mini-128k, Phi-4-mini: longrope factors, kept by llama.cpp as tensors
    "phi3-longrope": Case(
        Phi3Config,
        "phi3",
        transformers_reads_all=False,
        pad_token_id=0,
        original_max_position_embeddings=128,
        rope_parameters={
            "rope_type": "longrope",
            "rope_theta": 10000.0,
            "long_factor": [1.0 + i / 4 for i in range(8)],
            "short_factor": [1.0 + i / 8 for i in range(8)],
        },
    ),
    # Gemma's head size is its own (256); attention scales by it (query_pre_attn_scalar)
    "gemma2-f32": Case(Gemma2Config, "gemma2", head_dim=256, sliding_window=8),
    "gemma2-q8_0": Case(Gemma2Config, "gemma2", "Q8_0", head_dim=256, sliding_window=8),
    "gemma2-softcaps": Case(
        Gemma2Config,
        "gemma2",
        transformers_reads_all=False,
        head_dim=256,
        sliding_window=8,
        attn_logit_softcapping=7.0,
        final_logit_softcapping=3.0,
    ),
    # six layers: five sliding, then a global one with its own RoPE base; per-head q/k norms
    "gemma3-f32": Case(
        Gemma3TextConfig, "gemma3", head_dim=256, sliding_window=8, num_hidden_layers=6
    ),
    # Gemma 3 4B and up scale their global layers' RoPE linearly (llama.cpp writes the factor)
    "gemma3-rope-scaling": Case(
        Gemma3TextConfig,
        "gemma3",
        transformers_reads_all=False,
        head_dim=256,
        sliding_window=8,
        num_hidden_layers=6,
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
    ),
    "gemma3-q8_0": Case(Gemma3TextConfig, "gemma3", "Q8_0", head_dim=256, sliding_window=8),
    # Gemma 1: `1 + w` norms, GELU-tanh, tied head, no RoPE base in the file (10000)
    "gemma-f32": Case(GemmaConfig, "gemma", head_dim=256),
    "gemma-q8_0": Case(GemmaConfig, "gemma", "Q8_0", head_dim=32),
    # Granite: Llama's block (q/k rows permuted in the file) with its four multipliers
    "granite-f32": Case(GraniteConfig, "granite", **GRANITE_MULTIPLIERS),
    "granite-q8_0": Case(
        GraniteConfig, "granite", "Q8_0", tie_word_embeddings=True, **GRANITE_MULTIPLIERS
    ),
    # OLMo 2: post-norms only, q/k norms over the whole projection, untied head
    "olmo2-f32": Case(
        Olmo2Config, "olmo2", rope_parameters={"rope_type": "default", "rope_theta": 500000.0}
    ),
    "olmo2-q8_0": Case(Olmo2Config, "olmo2", "Q8_0"),
}


def _model(case: Case, tokenizer, seed: int = 0):
    """A tiny random model; its norms random too, in steps of 1/64 so that llama.cpp's `1 + w`
    (Gemma) gives `w` back exactly in float32, and q/k scaled up so attention is far from
    uniform (a wrong RoPE then moves the logits well past the tolerance)."""
    torch.manual_seed(seed)
    config = case.config_cls(**{**TINY_GGUF, "vocab_size": len(tokenizer), **case.overrides})
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(torch.randint(-32, 33, param.shape) / 64)
            elif name.endswith(("q_proj.weight", "k_proj.weight", "qkv_proj.weight")):
                param.mul_(16)
    return model


def _config_fields(config) -> dict:
    """The fields of `config` our decoder reads for Gemma 1, Granite and OLMo 2."""
    names = [
        "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
        "num_attention_heads", "num_key_value_heads", "max_position_embeddings", "rms_norm_eps",
        "tie_word_embeddings", "attention_bias", "bos_token_id", "eos_token_id", "head_dim",
        "hidden_act", "embedding_multiplier", "residual_multiplier", "attention_multiplier",
        "logits_scaling", "mlp_bias",
    ]  # fmt: skip
    return {name: getattr(config, name) for name in names if hasattr(config, name)}


def _logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def _prefill_logits(folder, ids: list[int]) -> torch.Tensor:
    config = EngineConfig(max_total_tokens=256, device="cpu", quantization="none", dtype="float32")
    runner = ModelRunner(folder, config)
    slots = runner.pool.alloc(len(ids))
    seg = Segment(token_ids=ids, start=0, kv_slots=slots, logits_from=0)
    logits = runner.forward([seg]).logits
    runner.pool.free(slots)
    return logits


@pytest.mark.parametrize("name", list(CASES))
def test_gguf_of_the_family_loads_the_original_weights_and_logits(tmp_path, tiny_tokenizer, name):
    case = CASES[name]
    model = _model(case, tiny_tokenizer)
    gguf_file = tmp_path / f"tiny-{name}.gguf"
    state = write_gguf(
        gguf_file, model, tiny_tokenizer, architecture=case.arch, quantize_linears=case.quant
    )
    original = {k: v for k, v in model.state_dict().items() if k in state}
    if case.quant is None:  # the file holds the original weights exactly
        assert all(torch.equal(state[k], original[k].float()) for k in original)
    model.load_state_dict(state, strict=False)  # the file's weights (Q8_0 rounded)
    ids = tiny_tokenizer.encode(PROMPT)
    want = _logits(model, ids)

    # (a) the writer is right: transformers' own GGUF loader computes the original model
    if case.transformers_reads_all:
        theirs = AutoModelForCausalLM.from_pretrained(
            tmp_path, gguf_file=gguf_file.name, dtype=torch.float32
        ).eval()
        assert (_logits(theirs, ids) - want).abs().max() <= 1e-4

    # (b) our reader gives the file's weights by transformers name, tensor by tensor
    folder = resolve_model_path(gguf_file)
    config = load_config(folder)
    assert config.model_type == model.config.model_type
    if case.arch in OWN_CONFIG:  # built from the metadata by us: every field that matters
        for field, value in _config_fields(model.config).items():
            expected = pytest.approx(value) if isinstance(value, float) else value
            assert getattr(config, field) == expected, field
        assert config.rope_parameters == model.config.rope_parameters
    weights = load_state_dict(folder, config)
    assert set(weights) == set(state)
    for key, tensor in state.items():
        assert torch.equal(weights[key], tensor), key
    if case.quant is not None:  # the linears' codes as the int kernels take them, rows in place
        codes = read_quantized(gguf_file, config)
        assert set(codes) == {k for k in state if "layers" in k and k.endswith("_proj.weight")}
        for key, affine in codes.items():
            assert torch.equal(affine.dequantize(), state[key]), key

    # (c) our runner on the file computes the original model
    assert (_prefill_logits(folder, ids) - want).abs().max() <= 1e-4


# Families transformers' GGUF loader reads the config of, and one it does not (Granite); a
# Mistral file says "llama" and is told apart by its name
CONVERTED = {
    "llama": (Case(LlamaConfig, "llama"), "tiny"),
    "mistral": (Case(MistralConfig, "llama"), "mistral"),
    "qwen2": (Case(Qwen2Config, "qwen2", attention_bias=True), "tiny"),
    "qwen3": (Case(Qwen3Config, "qwen3", head_dim=24), "tiny"),
    "phi3-longrope": (CASES["phi3-longrope"], "tiny"),
    "gemma2-softcaps": (CASES["gemma2-softcaps"], "tiny"),
    "gemma3-rope-scaling": (CASES["gemma3-rope-scaling"], "tiny"),
    "granite": (CASES["granite-f32"], "tiny"),
}


@pytest.mark.parametrize("name", list(CONVERTED))
def test_converting_a_gguf_decodes_no_vocabulary_and_gives_transformers_config_and_tokenizer(
    tmp_path, tiny_tokenizer, name, monkeypatch
):
    """A GGUF's config and tokenizer are written without gguf's full reader, which decodes the
    whole vocabulary token by token (3-5 s of a first load at 49k tokens); the config is the
    one transformers' own GGUF loader builds, and the tokenizer encodes as AutoTokenizer's."""
    import gguf

    case, model_name = CONVERTED[name]
    gguf_file = tmp_path / f"tiny-{name}.gguf"
    model = _model(case, tiny_tokenizer)
    write_gguf(gguf_file, model, tiny_tokenizer, architecture=case.arch, name=model_name)
    reads = []
    full_reader = gguf.GGUFReader

    def counted(*args, **kwargs):
        reads.append(args)
        return full_reader(*args, **kwargs)

    with monkeypatch.context() as patched:
        patched.setattr(gguf, "GGUFReader", counted)
        folder = resolve_model_path(gguf_file)
    assert reads == []
    assert load_config(folder).model_type == model.config.model_type
    if case.arch in OWN_CONFIG:  # transformers reads no config for these files
        return
    ours = transformers_config(read_header(gguf_file)).to_dict()
    theirs = AutoConfig.from_pretrained(tmp_path, gguf_file=gguf_file.name).to_dict()
    ours.pop("_name_or_path"), theirs.pop("_name_or_path")  # the folder it was read from
    assert ours == theirs
    tokenizer = AutoTokenizer.from_pretrained(folder)
    reference = AutoTokenizer.from_pretrained(tmp_path, gguf_file=gguf_file.name)
    assert type(tokenizer) is type(reference)
    assert tokenizer.get_vocab() == reference.get_vocab()
    if not case.arch.startswith("gemma"):  # Gemma's class cannot encode with this BPE vocabulary
        assert tokenizer.encode(PROMPT) == reference.encode(PROMPT)


def test_phi3s_fused_linears_come_as_codes_and_run_on_the_int_kernels(tmp_path, tiny_tokenizer):
    """Phi-3's file holds q/k/v and gate/up fused, as our model does: they come as codes under
    the fused names (exactly the file's weights), so the fast mode runs the file's own codes,
    decode steps on the onnxruntime graph, within rounding of the float32 model."""
    case = CASES["phi3-q8_0"]
    gguf_file = tmp_path / "phi3.gguf"
    state = write_gguf(
        gguf_file,
        _model(case, tiny_tokenizer),
        tiny_tokenizer,
        architecture="phi3",
        quantize_linears="Q8_0",
    )
    folder = resolve_model_path(gguf_file)
    codes = read_quantized(gguf_file, load_config(folder))
    layers = {k.split(".", 3)[3] for k in codes if k.startswith("model.layers.")}
    fused = {"self_attn.qkv_proj.weight", "mlp.gate_up_proj.weight"}
    assert layers == fused | {"self_attn.o_proj.weight", "mlp.down_proj.weight"}
    for key, weight in codes.items():
        assert torch.equal(weight.dequantize(), state[key]), key
    runner = ModelRunner(folder, EngineConfig(max_total_tokens=128, device="cpu"))
    assert runner.format.int_kind == "int8", runner.format.describe()
    assert runner.decode_step is not None, runner.format.describe()
    ids = tiny_tokenizer.encode(PROMPT)
    want = _prefill_logits(folder, ids)  # float32, no int kernels
    slots = runner.pool.alloc(len(ids))
    got = []
    for n in range(len(ids)):  # one token at a time: every pass a decode step on the graph
        seg = Segment(token_ids=[ids[n]], start=n, kv_slots=slots[: n + 1], logits_from=0)
        assert runner.decode_step.takes([seg])
        got.append(runner.forward([seg]).logits)
    got_logits = torch.cat(got)
    assert (got_logits - want).abs().max() <= 0.02 * want.abs().max()
    assert (got_logits.argmax(-1) == want.argmax(-1)).float().mean() >= 0.9


def test_every_served_family_has_a_gguf_architecture():
    """The refusal below lists the GGUF architectures; every family we serve is among them
    (as llama.cpp names it: Gemma 3's text model is "gemma3")."""
    gguf_name = {"gemma3_text": "gemma3"}
    assert {gguf_name.get(t, t) for t in SUPPORTED_MODEL_TYPES} == set(GGUF_ARCHITECTURES)


# OLMo 1 and Phi-2: families llama.cpp writes that we do not serve
@pytest.mark.parametrize("arch", ["olmo", "phi2"])
def test_a_gguf_of_a_family_we_do_not_read_is_refused_naming_the_supported_list(
    tmp_path, tiny_tokenizer, private_cache, arch
):
    gguf_file = tmp_path / f"{arch}.gguf"
    torch.manual_seed(0)
    config = LlamaConfig(**{**TINY_GGUF, "vocab_size": len(tiny_tokenizer)})
    write_gguf(
        gguf_file, AutoModelForCausalLM.from_config(config), tiny_tokenizer, architecture=arch
    )
    supported = ", ".join(GGUF_ARCHITECTURES)
    with pytest.raises(ModelLoadError, match=f"architecture '{arch}'.*{supported}"):
        resolve_model_path(gguf_file)
    assert not (private_cache / "models").exists()  # refused before any conversion work
