"""Custom logit processors (SGLang's `custom_logit_processor` + `custom_params`): the wire
string (ours and SGLang's, each loaded by the other), the real Engine over a fake runner
applying them to their own rows only, a failing processor failing only its request, and the
refusals (flag off, bad string, no dill) as 400s over HTTP with the field named."""

from __future__ import annotations

import gc
import json
import logging
import pickle
import sys

import httpx
import pytest
import torch

import sgl_lite
from sgl_lite.backend.config import EngineConfig
from sgl_lite.backend.engine import Engine
from sgl_lite.backend.errors import InvalidRequest
from sgl_lite.backend.scheduler import custom_logits
from sgl_lite.server import create_app
from tests.support.fakes import ByteTokenizer, FakeRunner
from tests.support.server import serve
from tests.support.tiny import build_tiny_tokenizer

SEEN_SHAPES: list[tuple[int, ...]] = []  # the logits each ForceToken call got


class ForceToken(sgl_lite.CustomLogitProcessor):
    """Every row to its request's custom_params["token_id"] (SGLang's documented example)."""

    def __call__(self, logits, custom_param_list=None):
        SEEN_SHAPES.append(tuple(logits.shape))
        for i, params in enumerate(custom_param_list):
            logits[i, :] = -float("inf")
            logits[i, params["token_id"]] = 0.0
        return logits


class Alphabet(sgl_lite.CustomLogitProcessor):
    """Token n of the output is the n-th letter: reads `__req__.output_ids`."""

    def __call__(self, logits, custom_param_list=None):
        out = torch.full_like(logits, -float("inf"))
        for i, params in enumerate(custom_param_list):
            req = params["__req__"]
            assert req.origin_input_ids and isinstance(req.rid, str)
            out[i, ord("a") + len(req.output_ids)] = 0.0
        return out


class Counts(sgl_lite.CustomLogitProcessor):
    """Keeps a step count in its request's dict (the same dict every step, as in SGLang)."""

    def __call__(self, logits, custom_param_list=None):
        for i, params in enumerate(custom_param_list):
            params["steps"] = params.get("steps", 0) + 1
            logits[i, :] = -float("inf")
            logits[i, params["first"] + params["steps"] - 1] = 0.0
        return logits


class Raises(sgl_lite.CustomLogitProcessor):
    """Fails on the rows whose custom_params say so, else leaves the logits alone."""

    def __call__(self, logits, custom_param_list=None):
        if any(p.get("fail") for p in custom_param_list):
            raise RuntimeError("processor bug")
        return logits


class WrongShape(sgl_lite.CustomLogitProcessor):
    def __call__(self, logits, custom_param_list=None):
        return logits[:, :3]


class BansAll(sgl_lite.CustomLogitProcessor):
    def __call__(self, logits, custom_param_list=None):
        return torch.full_like(logits, -float("inf"))


GREEDY = {"max_new_tokens": 4, "temperature": 0}


def config(**kwargs) -> EngineConfig:
    return EngineConfig(device="cpu", max_total_tokens=4096, **kwargs)


@pytest.fixture(scope="module")
def engine():
    with Engine(
        config(enable_custom_logit_processor=True), runner=FakeRunner(), tokenizer=ByteTokenizer()
    ) as eng:
        yield eng


def forced(token: str, **params) -> dict:
    return {**GREEDY, **params, "custom_params": {"token_id": ord(token)}}


def test_a_processor_forces_its_token_greedy_and_sampled(engine):
    wire = ForceToken.to_str()
    assert engine.generate("hello", forced("q"), custom_logit_processor=wire)["text"] == "qqqq"
    sampled = forced("z", temperature=1.0, top_p=0.9)
    assert engine.generate("hello", sampled, custom_logit_processor=wire)["text"] == "zzzz"


def test_requests_share_one_call_with_their_own_params_and_others_are_untouched(engine):
    wire = ForceToken.to_str()
    alone = engine.generate("other", GREEDY)["text"]
    SEEN_SHAPES.clear()
    out = engine.generate(
        ["one", "two", "other"],
        [forced("x"), forced("y"), GREEDY],
        custom_logit_processor=[wire, wire, None],
    )
    assert [o["text"] for o in out] == ["xxxx", "yyyy", alone]
    assert SEEN_SHAPES[0] == (2, 260)  # the two requests' rows, batched, as SGLang does


def test_n_samples_each_get_the_processor(engine):
    out = engine.generate(
        "hello", forced("k", n=2, temperature=1.0), custom_logit_processor=ForceToken.to_str()
    )
    assert [o["text"] for o in out] == ["kkkk", "kkkk"]


def test_the_req_view_shows_the_output_so_far(engine):
    out = engine.generate("hello", GREEDY, custom_logit_processor=Alphabet.to_str())
    assert out["text"] == "abcd"


def test_a_requests_params_dict_persists_across_its_steps_and_is_its_own(engine):
    params = {**GREEDY, "n": 2, "custom_params": {"first": ord("p")}}
    out = engine.generate(["x", "y"], [params, params], custom_logit_processor=Counts.to_str())
    assert [o["text"] for o in out] == ["pqrs"] * 4  # each of the 4 requests counted alone
    assert params["custom_params"] == {"first": ord("p")}  # the caller's dict is untouched
    gc.collect()
    assert not custom_logits._PARAMS  # held weakly: ended requests' dicts went with them


def test_the_string_is_loaded_once():
    wire = ForceToken.to_str()
    first = custom_logits.load_processor(wire)
    assert custom_logits.load_processor(wire) is first
    assert ForceToken.from_str(wire) is first and isinstance(first, ForceToken)


@pytest.mark.parametrize(
    ("processor", "why"),
    [(Raises, "RuntimeError: processor bug"), (WrongShape, "shape"), (BansAll, "no finite")],
)
def test_a_failing_processor_fails_only_its_own_request(engine, processor, why):
    alone = engine.generate(["p", "q"], GREEDY)
    out = engine.generate(
        ["p", "q", "r"],
        [GREEDY, {**GREEDY, "custom_params": {"fail": True}}, GREEDY],
        custom_logit_processor=[None, processor.to_str(), None],
    )
    assert out[0]["text"] == alone[0]["text"]
    reason = out[1]["meta_info"]["finish_reason"]
    assert reason["type"] == "abort" and why in reason["message"]
    assert processor.__name__ in reason["message"]
    assert out[2]["text"] == engine.generate("r", GREEDY)["text"]
    engine.check_integrity()  # the failed request's slots were freed
    assert engine.generate("p", GREEDY)["text"] == alone[0]["text"]  # the engine serves on


def test_one_bad_params_dict_fails_only_its_request_in_a_shared_call(engine):
    wire = Raises.to_str()
    out = engine.generate(
        ["a", "b"],
        [{**GREEDY, "custom_params": {"fail": True}}, {**GREEDY, "custom_params": {}}],
        custom_logit_processor=[wire, wire],
    )
    assert out[0]["meta_info"]["finish_reason"]["type"] == "abort"
    assert out[1]["meta_info"]["finish_reason"]["type"] == "length"
    assert out[1]["text"] == engine.generate("b", GREEDY)["text"]


def test_a_processor_runs_before_the_constraint_which_always_wins():
    tokenizer = build_tiny_tokenizer()  # a real vocabulary, for the grammar
    runner = FakeRunner(vocab_size=len(tokenizer))
    with Engine(
        config(enable_custom_logit_processor=True), runner=runner, tokenizer=tokenizer
    ) as eng:
        wire = ForceToken.to_str()

        def force(token: str) -> dict:
            token_id = tokenizer.convert_tokens_to_ids(token)
            return {**GREEDY, "regex": "[a-z]{4}", "custom_params": {"token_id": token_id}}

        assert eng.generate("hello", force("m"), custom_logit_processor=wire)["text"] == "mmmm"
        # forcing "7" where the regex allows letters only: nothing is left to sample
        out = eng.generate("hello", force("7"), custom_logit_processor=wire)
        reason = out["meta_info"]["finish_reason"]
        assert reason["type"] == "abort" and "constraint allows" in reason["message"]
        eng.check_integrity()


BAD_STRINGS = [
    ("not json", "not JSON"),
    (json.dumps([1, 2]), "JSON object"),
    (json.dumps({"callable": "zz"}), "hex"),
    (json.dumps({"callable": b"not a pickle".hex()}), "could not be loaded"),
    (json.dumps({"callable": pickle.dumps(42).hex()}), "not a class"),
]


@pytest.mark.parametrize(("wire", "why"), BAD_STRINGS)
def test_a_bad_string_is_an_invalid_request_naming_the_field(engine, wire, why):
    with pytest.raises(InvalidRequest, match=why) as caught:
        engine.generate("hello", GREEDY, custom_logit_processor=wire)
    assert caught.value.field == "custom_logit_processor"


def test_an_abstract_or_uncallable_class_is_refused(engine):
    import dill

    for cls in (sgl_lite.CustomLogitProcessor, int):
        wire = json.dumps({"callable": dill.dumps(cls).hex()})
        with pytest.raises(InvalidRequest, match="instantiated|__call__"):
            engine.generate("hello", GREEDY, custom_logit_processor=wire)


def test_custom_params_must_be_an_object(engine):
    with pytest.raises(InvalidRequest, match="custom_params must be a dict"):
        engine.generate("hello", {**GREEDY, "custom_params": [1]})


def test_without_the_flag_a_processor_is_refused_with_sglangs_words():
    with Engine(config(), runner=FakeRunner(), tokenizer=ByteTokenizer()) as eng:
        with pytest.raises(InvalidRequest) as caught:
            eng.generate("hello", forced("q"), custom_logit_processor=ForceToken.to_str())
        assert caught.value.field == "custom_logit_processor"
        assert str(caught.value).startswith(
            "The server is not configured to enable custom logit processor."
        )
        assert "--enable-custom-logit-processor" in str(caught.value)
        # custom_params alone is harmless, as in SGLang
        assert eng.generate("hello", forced("q"))["text"] == eng.generate("hello", GREEDY)["text"]


def test_without_dill_a_request_is_a_400_naming_it_and_start_up_warns(monkeypatch, caplog):
    custom_logits.load_processor.cache_clear()
    monkeypatch.setitem(sys.modules, "dill", None)  # import dill now raises ImportError
    with (
        caplog.at_level(logging.WARNING, logger="sgl_lite"),
        Engine(
            config(enable_custom_logit_processor=True),
            runner=FakeRunner(),
            tokenizer=ByteTokenizer(),
        ) as eng,
    ):
        assert any("dill" in r.message for r in caplog.records if r.levelno == logging.WARNING)
        with pytest.raises(InvalidRequest, match="dill package") as caught:
            eng.generate("hello", GREEDY, custom_logit_processor='{"callable": "00"}')
        assert caught.value.field == "custom_logit_processor"
    assert not custom_logits.is_available()


def test_over_http_generate_chat_and_completions_apply_it(url):
    wire = ForceToken.to_str()
    native = httpx.post(
        f"{url}/generate",
        json={"text": "hi", "sampling_params": forced("w"), "custom_logit_processor": wire},
        timeout=30,
    )
    assert native.status_code == 200, native.text
    assert native.json()["text"] == "wwww"
    body = {"max_tokens": 4, "custom_logit_processor": wire, "custom_params": {"token_id": 118}}
    # (the byte tokenizer has no chat template: /v1/completions is the OpenAI side here)
    completion = httpx.post(f"{url}/v1/completions", json={"prompt": "hi", **body}, timeout=30)
    assert completion.status_code == 200, completion.text
    assert completion.json()["choices"][0]["text"] == "vvvv"


def test_over_http_a_failing_processor_is_a_400(url):
    body = {
        "text": "hi",
        "sampling_params": {**GREEDY, "custom_params": {"fail": True}},
        "custom_logit_processor": Raises.to_str(),
    }
    response = httpx.post(f"{url}/generate", json=body, timeout=30)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "custom_logit_processor" and "processor bug" in error["message"]
    streamed = httpx.post(f"{url}/generate", json={**body, "stream": True}, timeout=30)
    assert streamed.status_code == 400  # it failed before any output: a status, not an event
    assert streamed.json()["error"]["param"] == "custom_logit_processor"


def test_over_http_a_bad_string_or_a_server_without_the_flag_is_a_400():
    with (
        Engine(config(), runner=FakeRunner(), tokenizer=ByteTokenizer()) as eng,
        serve(create_app(eng)) as base,
    ):
        for path, body in (
            ("/generate", {"text": "hi"}),
            ("/v1/completions", {"prompt": "hi", "max_tokens": 2}),
        ):
            body["custom_logit_processor"] = ForceToken.to_str()
            response = httpx.post(f"{base}{path}", json=body, timeout=30)
            assert response.status_code == 400, response.text
            error = response.json()["error"]
            assert error["param"] == "custom_logit_processor"
            assert "--enable-custom-logit-processor" in error["message"]


def test_a_string_made_by_sglang_runs_here_and_ours_runs_on_sglang():
    from sglang.srt.sampling.custom_logit_processor import (
        CustomLogitProcessor as SGLangProcessor,
    )

    def sglang_client_class():
        class Ban(SGLangProcessor):  # a local class: dill carries it by value
            def __call__(self, logits, custom_param_list=None):
                logits[:, custom_param_list[0]["token_id"]] = -float("inf")
                return logits

        return Ban

    theirs = custom_logits.load_processor(sglang_client_class().to_str())
    assert isinstance(theirs, sgl_lite.CustomLogitProcessor)  # SGLang's base loads as ours
    assert theirs(torch.zeros(1, 4), [{"token_id": 2}]).tolist() == [[0, 0, -float("inf"), 0]]

    def our_client_class():
        class Keep(sgl_lite.CustomLogitProcessor):
            def __call__(self, logits, custom_param_list=None):
                return torch.where(torch.arange(logits.shape[1]) == 1, logits, -torch.inf)

        return Keep

    wire = our_client_class().to_str()
    assert b"sgl_lite" not in bytes.fromhex(json.loads(wire)["callable"])
    ours_there = SGLangProcessor.from_str(wire)  # SGLang's own loader: plain dill.loads
    assert isinstance(ours_there, SGLangProcessor)
    assert ours_there(torch.zeros(1, 3), [{}]).tolist() == [[-float("inf"), 0, -float("inf")]]


def test_the_flag_reaches_the_engine_config():
    from sgl_lite.server_args import build_parser, engine_kwargs

    args = build_parser().parse_args(["--enable-custom-logit-processor"])
    assert engine_kwargs(args)["enable_custom_logit_processor"] is True
    assert "enable_custom_logit_processor" not in engine_kwargs(build_parser().parse_args([]))
