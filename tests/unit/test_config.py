"""EngineConfig is built once: arguments, then the environment, then frozen and checked; the
engine takes a built config as well as keyword arguments."""

from __future__ import annotations

import dataclasses

import pytest

from sgl_lite.backend.config import EngineConfig
from sgl_lite.backend.engine import Engine
from tests.support.fakes import ByteTokenizer, FakeRunner


def test_the_environment_fills_only_what_the_arguments_leave_unset(monkeypatch):
    monkeypatch.setenv("SGL_LITE_NUM_THREADS", "3")
    assert EngineConfig.from_kwargs(device="cpu").num_threads == 3
    assert EngineConfig.from_kwargs(device="cpu", num_threads=1).num_threads == 1
    assert EngineConfig(device="cpu").num_threads is None  # direct construction reads nothing
    monkeypatch.setenv("SGL_LITE_NUM_THREADS", "many")
    with pytest.raises(ValueError, match="SGL_LITE_NUM_THREADS"):
        EngineConfig.from_kwargs()


def test_the_config_is_frozen_and_names_bad_values():
    config = EngineConfig.from_kwargs(device="")  # "" means: pick the default device
    assert config.device in ("cpu", "cuda")
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.device = "cuda"  # type: ignore[misc]
    with pytest.raises(ValueError, match="schedule_policy"):
        EngineConfig(device="cpu", schedule_policy="random")
    with pytest.raises(ValueError, match="unknown engine argument"):
        EngineConfig.from_kwargs(max_total_tokenz=5)


def test_the_engine_takes_a_built_config_but_not_a_config_and_flags():
    config = EngineConfig(device="cpu", max_total_tokens=256, random_seed=4)
    with Engine(config, runner=FakeRunner(256), tokenizer=ByteTokenizer()) as engine:
        assert engine.config is config and engine.context_length == 2048
        assert engine.max_new_tokens_room(10) == 245
        assert engine.generate("x", {"max_new_tokens": 2})["meta_info"]["completion_tokens"] == 2
    with pytest.raises(ValueError, match="not both"):
        Engine(config, runner=FakeRunner(256), tokenizer=ByteTokenizer(), max_total_tokens=5)


def test_the_xgrammar_backend_without_its_optional_extra_says_how_to_install_it(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "xgrammar" else real(name, *a)
    )
    with pytest.raises(ValueError, match=r"pip install 'sgl_lite\[xgrammar\]'"):
        EngineConfig(grammar_backend="xgrammar")
    assert EngineConfig(grammar_backend="auto").grammar_backend == "auto"  # auto never needs it
