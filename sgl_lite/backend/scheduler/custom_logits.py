"""Custom logit processors (SGLang's `custom_logit_processor`): the wire format, loading, running.

A client subclasses `CustomLogitProcessor` (exported as `sgl_lite.CustomLogitProcessor`),
implements `__call__(self, logits, custom_param_list)` and sends `MyProcessor.to_str()` as the
request's `custom_logit_processor`, with per-request values in `sampling_params.custom_params`.
Each step the sampler hands every processor the logits rows of its requests (B, V) and one dict
per row: the request's `custom_params` plus `"__req__"`, a read-only view of the request
(`origin_input_ids`, `output_ids`, `rid`); the processor returns the rows to sample from.

The wire format is SGLang's: `{"callable": "<hex of dill.dumps(cls)>"}`. Our base class is
pickled under SGLang's name for its own (`sglang.srt.sampling.custom_logit_processor.
CustomLogitProcessor`) and that name loads as ours, so a string made with either library runs
on either server. Loading a string runs the code in it (dill can carry any function), which is
why a server accepts processors only when started with `--enable-custom-logit-processor`.

Boundary: this module checks and loads strings (`load_processor`, cached per distinct string:
the caller's thread, before a request is queued) and runs processors on a step's logits
(`apply_processors`: the loop thread, called by the sampler). A processor that fails, or whose
rows leave nothing to sample, fails only its own requests: `apply_processors` reports them.
"""

from __future__ import annotations

import copy
import functools
import importlib
import io
import json
import logging
import weakref
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

import torch

from sgl_lite.backend.errors import InvalidRequest

if TYPE_CHECKING:
    from sgl_lite.backend.types import Req

logger = logging.getLogger("sgl_lite")

# Where SGLang defines its base class: the name both libraries pickle and load the base under.
SGLANG_MODULE = "sglang.srt.sampling.custom_logit_processor"
BASE_NAME = "CustomLogitProcessor"
FIELD = "custom_logit_processor"
# SGLang's wording (clients match on it), for a request that sends a processor to a server
# started without the flag; then ours
NOT_ENABLED = (
    "The server is not configured to enable custom logit processor. Please set "
    "`--enable-custom-logit-processor` to enable this feature. (This request sets "
    "custom_logit_processor; in Python: Engine(enable_custom_logit_processor=True).)"
)
# distinct processor strings kept loaded (one class and one instance each)
CACHE_SIZE = 64


class CustomLogitProcessor(ABC):
    """A logits transform a request carries to the server; subclass it and send `to_str()`.

    `__call__(logits, custom_param_list)` gets the (B, V) float logits rows of the B requests
    that use this processor in a step, and their B dicts (each request's `custom_params` plus
    `"__req__"`: `origin_input_ids`, `output_ids`, `rid`); it returns (B, V) logits (editing
    `logits` in place and returning it is fine). It is instantiated once per distinct string,
    so keep per-request state in the request's dict, which is the same object at every step
    of that request (as in SGLang), not on `self`.
    """

    @abstractmethod
    def __call__(
        self, logits: torch.Tensor, custom_param_list: list[dict[str, Any]] | None = None
    ) -> torch.Tensor:
        """The processed logits rows."""

    @classmethod
    def to_str(cls) -> str:
        """The class as SGLang's wire string: `{"callable": hex(dill.dumps(cls))}` (a class
        defined in `__main__` or a function travels by value, one in an importable module by
        its name, which the server must be able to import). The globals its code reads
        (`torch`, ...) travel with it, by name for modules."""
        dill = _dill()
        buffer = io.BytesIO()
        _wire_pickler(dill)(buffer, recurse=True).dump(cls)
        return json.dumps({"callable": buffer.getvalue().hex()})

    @classmethod
    def from_str(cls, wire: str) -> CustomLogitProcessor:
        """The processor a wire string holds, instantiated (cached per string)."""
        return load_processor(wire)


class ReqView:
    """What a processor's `"__req__"` shows of a request (SGLang's `Req` attribute names):
    copies, so a processor cannot change the engine's state. It holds the request weakly (the
    request's params dict holds the view, and must not keep the request alive)."""

    __slots__ = ("_ref",)

    def __init__(self, req: Req) -> None:
        self._ref = weakref.ref(req)

    @property
    def _req(self) -> Req:
        req = self._ref()
        if req is None:
            raise ReferenceError("the request has ended")
        return req

    @property
    def rid(self) -> str:
        """The request id."""
        return self._req.rid

    @property
    def origin_input_ids(self) -> list[int]:
        """The prompt's token ids."""
        return list(self._req.input_ids)

    @property
    def output_ids(self) -> list[int]:
        """The tokens generated so far."""
        return list(self._req.output_ids)


def is_available() -> bool:
    """Whether `dill`, which loads processor strings, is installed."""
    try:
        _dill()
    except InvalidRequest:
        return False
    return True


def warn_if_unavailable() -> None:
    """Start-up check for `--enable-custom-logit-processor`: logs a warning without dill."""
    if not is_available():
        logger.warning(
            "--enable-custom-logit-processor is set but the dill package is not installed: "
            "requests with a custom_logit_processor will get a 400 (pip install dill)"
        )
    else:
        logger.info(
            "custom logit processors are enabled: each request's custom_logit_processor runs "
            "its own code in this process"
        )


@functools.lru_cache(maxsize=CACHE_SIZE)
def load_processor(wire: str) -> CustomLogitProcessor:
    """The processor a wire string holds, instantiated once per distinct string; an
    `InvalidRequest` naming custom_logit_processor says what is wrong with a bad one."""
    dill = _dill()
    try:
        payload = json.loads(wire)
    except ValueError:
        raise _bad("is not JSON; send the string CustomLogitProcessor.to_str() returns") from None
    if not isinstance(payload, dict) or not isinstance(payload.get("callable"), str):
        raise _bad('must be a JSON object {"callable": "<hex of the dill-pickled class>"}')
    try:
        data = bytes.fromhex(payload["callable"])
    except ValueError:
        raise _bad('"callable" is not a hex string') from None
    try:
        loaded = _wire_unpickler(dill)(io.BytesIO(data)).load()
    except ImportError as exc:
        raise _bad(f"needs a module this server cannot import ({exc})") from None
    except Exception as exc:  # any corrupt pickle: UnpicklingError, EOFError, ValueError, ...
        raise _bad(f"could not be loaded: {type(exc).__name__}: {exc}") from None
    if not isinstance(loaded, type):
        raise _bad(f"holds a {type(loaded).__name__}, not a class (send MyProcessor.to_str())")
    try:
        processor = loaded()
    except Exception as exc:  # an abstract class, an __init__ that needs arguments
        raise _bad(f"class {loaded.__name__} cannot be instantiated: {exc}") from None
    if not callable(processor):
        raise _bad(f"class {loaded.__name__} has no __call__(logits, custom_param_list)")
    return processor


def apply_processors(logits: torch.Tensor, reqs: list[Req]) -> dict[int, InvalidRequest]:
    """Runs each request's processor on its row of `logits` (B, V), in place: one call per
    processor over all its rows (SGLang's batching). Returns row -> error for the rows whose
    processor raised, returned something else than their rows, or left no finite logit; those
    rows keep their logits unchanged (a failed call is retried row by row, so a request's own
    bad params fail only that request)."""
    groups: dict[int, list[int]] = {}
    for i, req in enumerate(reqs):
        if req.custom_logit_processor is not None:
            groups.setdefault(id(req.custom_logit_processor), []).append(i)
    failures: dict[int, InvalidRequest] = {}
    for rows in groups.values():
        try:
            _run(logits, reqs, rows)
        except Exception as exc:
            if len(rows) == 1:
                failures[rows[0]] = _failed(reqs[rows[0]], exc)
                continue
            for row in rows:
                try:
                    _run(logits, reqs, [row])
                except Exception as exc:
                    failures[row] = _failed(reqs[row], exc)
    return failures


def no_token_left(logits: torch.Tensor, reqs: list[Req]) -> dict[int, InvalidRequest]:
    """Row -> error for the processor rows of the final (masked) logits with no finite value:
    the processor banned every token the constraint allows, so there is nothing to sample."""
    rows = [i for i, r in enumerate(reqs) if r.custom_logit_processor is not None]
    if not rows:
        return {}
    index = torch.tensor(rows, device=logits.device)
    empty = ~torch.isfinite(logits.index_select(0, index)).any(dim=-1)
    return {
        row: _failed(reqs[row], ValueError("it left no token the request's constraint allows"))
        for row, none in zip(rows, empty.tolist())
        if none
    }


def _run(logits: torch.Tensor, reqs: list[Req], rows: list[int]) -> None:
    """One processor call over `rows`; writes the rows back only when the result is sound."""
    processor = reqs[rows[0]].custom_logit_processor
    assert processor is not None
    index = torch.tensor(rows, device=logits.device)
    picked = logits.index_select(0, index)  # a copy: a failed call leaves `logits` as it was
    out = processor(picked, [_params_of(reqs[r]) for r in rows])
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(picked.shape):
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise TypeError(f"it returned {got}, not logits of shape {tuple(picked.shape)}")
    out = out.to(device=logits.device, dtype=logits.dtype)
    if torch.isnan(out).any() or not torch.isfinite(out).any(dim=-1).all():
        raise ValueError("it returned a row with a NaN or with no finite logit")
    logits.index_copy_(0, index, out)


# each running request's params dict, made at its first step and dropped with the request
_PARAMS: weakref.WeakKeyDictionary[Req, dict[str, Any]] = weakref.WeakKeyDictionary()


def _params_of(req: Req) -> dict[str, Any]:
    """The dict the request's processor gets: its own deep copy of `custom_params` (the n
    samples of a prompt share one SamplingParams) plus "__req__", the same object each step."""
    params = _PARAMS.get(req)
    if params is None:
        params = copy.deepcopy(req.sampling_params.custom_params or {})
        params["__req__"] = ReqView(req)
        _PARAMS[req] = params
    return params


def _failed(req: Req, exc: Exception) -> InvalidRequest:
    name = type(req.custom_logit_processor).__name__
    return InvalidRequest(
        FIELD, f"custom logit processor {name} failed: {type(exc).__name__}: {exc}"
    )


def _bad(why: str) -> InvalidRequest:
    return InvalidRequest(FIELD, f"custom_logit_processor {why}")


def _dill() -> Any:
    """The dill module; an InvalidRequest naming the package when it is not installed."""
    try:
        return importlib.import_module("dill")
    except ImportError:
        raise InvalidRequest(
            FIELD,
            "custom_logit_processor needs the dill package, which is not installed on the "
            "server: pip install dill (or sgl_lite[server])",
        ) from None


class _ModuleNamed:
    """Pickles as `importlib.import_module(name)`: a module named without importing it."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (importlib.import_module, (self.name,))


@functools.cache
def _wire_pickler(dill: Any) -> type:
    """dill's Pickler that writes our base class as SGLang's (`getattr(import_module(
    SGLANG_MODULE), "CustomLogitProcessor")`), so SGLang's server loads our strings."""

    class WirePickler(dill.Pickler):
        def reducer_override(self, obj: Any) -> Any:
            if obj is CustomLogitProcessor:
                return (getattr, (_ModuleNamed(SGLANG_MODULE), BASE_NAME))
            return NotImplemented

    return WirePickler


def _import_for_wire(name: str) -> Any:
    """`importlib.import_module` as our strings' base-class reference calls it: SGLang's module
    is this one here."""
    if name == SGLANG_MODULE:
        return importlib.import_module(__name__)
    return importlib.import_module(name)


@functools.cache
def _wire_unpickler(dill: Any) -> type:
    """dill's Unpickler that loads SGLang's base class as ours: by name (as SGLang's strings
    carry it) or through `import_module` (as ours do)."""

    class WireUnpickler(dill.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            if module == SGLANG_MODULE and name == BASE_NAME:
                return CustomLogitProcessor
            if (module, name) == ("importlib", "import_module"):
                return _import_for_wire
            return super().find_class(module, name)

    return WireUnpickler
