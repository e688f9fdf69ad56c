"""OpenMP's wait policy: a short spin by default, set before torch loads, never over the user's."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from sgl_lite.backend import omp_policy


@pytest.fixture
def clean_env(monkeypatch):
    """No wait-policy knob in the environment and torch not loaded, as in a fresh process."""
    for knob in (*omp_policy.KNOBS, omp_policy.KEEP_DEFAULTS):
        monkeypatch.delenv(knob, raising=False)
    monkeypatch.delitem(sys.modules, "torch")
    monkeypatch.setattr(omp_policy, "_state", "unapplied")


def test_a_fresh_process_gets_a_short_spin(clean_env):
    omp_policy.apply()
    omp_policy.apply()  # a second call (another import path) changes nothing
    assert os.environ["GOMP_SPINCOUNT"] == "10000" and "OMP_WAIT_POLICY" not in os.environ
    assert "GOMP_SPINCOUNT=10000, a short spin" in omp_policy.note()


@pytest.mark.parametrize(
    "knob,value",
    [("OMP_WAIT_POLICY", "ACTIVE"), ("GOMP_SPINCOUNT", "0"), ("SGL_LITE_KEEP_OMP_DEFAULTS", "1")],
)
def test_a_knob_the_user_set_is_kept(clean_env, monkeypatch, knob, value):
    monkeypatch.setenv(knob, value)
    omp_policy.apply()
    assert os.environ[knob] == value
    assert os.environ.get("GOMP_SPINCOUNT", "") != "10000"
    assert f"{knob}={value}" in omp_policy.note()


def test_nothing_is_set_once_torch_is_loaded(clean_env, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", object())
    omp_policy.apply()
    assert "GOMP_SPINCOUNT" not in os.environ
    assert "torch was imported before" in omp_policy.note()


def test_importing_the_backend_sets_it_before_torch_loads():
    env = {k: v for k, v in os.environ.items() if k not in omp_policy.KNOBS}
    code = (
        "import sys, os; import sgl_lite.backend; "
        "print(os.environ.get('GOMP_SPINCOUNT'), 'torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.stdout.split() == ["10000", "False"], out.stderr
