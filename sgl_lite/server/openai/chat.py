"""`POST /v1/chat/completions`: OpenAI chat, structured output and tool calling.

The body is checked field by field (`compat.chat_body`: nothing is dropped silently), the
messages and tools become one prompt (`tools.chat_prompt`), `response_format`, a required /
named tool choice, or SGLang's / vLLM's constraint fields (`guided.py`) become the generation's
constraint, and the engine's text comes back as content or as `tool_calls` (`tool_parser`),
whole or as streaming deltas.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from fastapi import FastAPI, Request

from sgl_lite.backend.engine.inputs import GenerateInput
from sgl_lite.server import compat
from sgl_lite.server.bridge import EngineBridge
from sgl_lite.server.openai.completions import (
    _ALIASES,
    _chat_logprobs,
    _finish,
    _Reply,
    _streaming,
    model_checker,
)
from sgl_lite.server.openai.guided import (
    ANY_OBJECT,
    Constraint,
    body_constraint,
    given_constraints,
    require_one,
)
from sgl_lite.server.openai.tool_formats import ToolFormat, marker_is_special, resolve_format
from sgl_lite.server.openai.tool_parser import Scan, ToolDeltas, message, scan
from sgl_lite.server.openai.tools import (
    ToolPlan,
    chat_messages,
    chat_prompt,
    constraint,
    plan_tools,
    template_renders_tools,
)
from sgl_lite.server.protocol import (
    DEFAULT_MAX_TOKENS,
    ApiError,
    ChatCompletionRequest,
    JsonResponse,
    omitted_budget,
    parse,
    read_json,
)

_IMPLEMENTED = set(ChatCompletionRequest.model_fields)
ANY_OBJECT_SCHEMA = ANY_OBJECT  # response_format json_object's schema


def add_chat_routes(
    app: FastAPI,
    bridge: EngineBridge,
    *,
    served_model_name: str,
    accepted_names: set[str],
    max_body_bytes: int,
    default_max_tokens: int | None = DEFAULT_MAX_TOKENS,
) -> None:
    """Adds `/v1/chat/completions` to `app` (`default_max_tokens`: a body without a budget
    gets at most this many tokens; None: the whole room)."""
    engine = bridge.engine
    check_model = model_checker(served_model_name, accepted_names)
    fmt, keep_special, ending = tool_setup(engine)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        body = compat.chat_body(await read_json(request, max_body_bytes), _IMPLEMENTED)
        req = parse(ChatCompletionRequest, body)
        check_model(req.model)
        if req.top_logprobs and not req.logprobs:
            raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        plan = plan_tools(req.tools, req.tool_choice, req.parallel_tool_calls, fmt)
        add_generation_prompt = _check_prefill(req)
        try:
            text = chat_prompt(
                engine.tokenizer,
                chat_messages(req.messages),
                plan,
                add_generation_prompt,
                template_kwargs=_template_kwargs(req.chat_template_kwargs),
                continue_final_message=req.continue_final_message,
            )
        except ApiError:
            raise
        except Exception as exc:
            raise ApiError(400, f"chat template failed: {exc}", param="messages") from None
        ids = engine.tokenizer.encode(text, add_special_tokens=False)
        max_tokens = (
            req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        )
        if max_tokens is None:  # until EOS, within the room left and the server's default
            max_tokens = omitted_budget(engine.max_new_tokens_room(len(ids)), default_max_tokens)
        output_format = _constraint(req, plan)
        params = {**req.sampling_params(max_tokens), **output_format.params}
        raw = plan.mode == "auto" and keep_special and req.skip_special_tokens
        if raw:
            params["skip_special_tokens"] = False
        shed = ending if raw else ()
        with bridge.refusals({**_ALIASES, "input_ids": "messages", **output_format.aliases}):
            inp = GenerateInput(
                input_ids=ids,
                sampling_params=params,
                rid=req.rid,
                return_logprob=req.logprobs,
                top_logprobs_num=req.top_logprobs or 0,
                return_text_in_logprobs=True,
                stream=req.stream,
                timeout=req.timeout,
                custom_logit_processor=req.custom_logit_processor,
            )
            sub = await bridge.submit(inp, overload_status=429)
        reply = _Reply("chatcmpl", "chat.completion", served_model_name, req.n)
        include_usage = req.stream_options and req.stream_options.include_usage
        if req.stream:
            convert = reply.chat_chunk if plan.mode == "none" else _ToolChunks(plan, reply, shed)
            return await _streaming(sub, bridge, convert, reply, include_usage)
        results = await bridge.collect(sub, request)
        choices = []
        for i, r in enumerate(results):
            finish = _finish(r["meta_info"])
            if plan.mode == "none":
                msg: dict[str, Any] = {"role": "assistant", "content": r["text"]}
            else:
                result = scan(plan, _shed(r["text"], shed), final=True)
                msg = message(result)
                finish = _tool_finish(finish, result)
            choices.append(
                {
                    "index": i,
                    "message": msg,
                    "logprobs": _chat_logprobs(r["meta_info"], 0) if req.logprobs else None,
                    **finish,
                }
            )
        return JsonResponse(reply.body(choices, results))


class ToolSetup(NamedTuple):
    """How an engine's answers carry tool calls (shared with /v1/responses)."""

    fmt: ToolFormat  # the format "auto" answers are read in
    keep_special: bool  # "auto" answers are decoded with special tokens kept
    ending: tuple[str, ...]  # the special tokens shed from the end of such an answer


def tool_setup(engine: Any) -> ToolSetup:
    """The engine's tool-call format (`--tool-call-parser`, else its chat template's)."""
    tokenizer = getattr(engine, "tokenizer", None)  # NOTE: test engines may have none
    fmt = resolve_format(
        getattr(engine.config, "tool_call_parser", "auto"),
        tokenizer,
        template_renders_tools(tokenizer),
    )
    # NOTE: a marker that is one special token (Mistral's [TOOL_CALLS]) is dropped by decoding
    # with skip_special_tokens, so "auto" answers keep special tokens and shed the ending ones
    keep_special = marker_is_special(fmt, tokenizer)
    ending = tuple(t for t in getattr(tokenizer, "all_special_tokens", ()) if t)
    return ToolSetup(fmt, keep_special, ending)


# apply_chat_template's own parameters and the variables the server sets itself
_RESERVED_TEMPLATE_KWARGS = frozenset(
    {"conversation", "messages", "tools", "documents", "add_generation_prompt", "tokenize"}
    | {"continue_final_message", "return_dict", "return_tensors", "chat_template"}
)


def _template_kwargs(kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """`chat_template_kwargs` as template variables; a 400 for one the server sets itself."""
    for key in kwargs or {}:
        if key in _RESERVED_TEMPLATE_KWARGS:
            raise ApiError(
                400,
                f"chat_template_kwargs.{key} is set by the server from the request "
                f"(reserved: {', '.join(sorted(_RESERVED_TEMPLATE_KWARGS))})",
                param=f"chat_template_kwargs.{key}",
            )
    return dict(kwargs or {})


def _check_prefill(req: ChatCompletionRequest) -> bool:
    """`add_generation_prompt` for the request; a 400 when `continue_final_message` is set
    with it or without an assistant message to continue (vLLM's checks)."""
    if not req.continue_final_message:
        return True if req.add_generation_prompt is None else req.add_generation_prompt
    if req.add_generation_prompt:
        raise ApiError(
            400,
            "continue_final_message and add_generation_prompt cannot both be true: one continues "
            "the last message, the other opens a new assistant turn",
            param="continue_final_message",
        )
    if req.messages[-1].role != "assistant":
        raise ApiError(
            400,
            "continue_final_message needs the last message to be the assistant's (the text to "
            f"continue); it is {req.messages[-1].role!r}",
            param="messages",
        )
    return False


def _constraint(req: ChatCompletionRequest, plan: ToolPlan) -> Constraint:
    """The constraint from response_format, a forced tool call, or the body's SGLang / vLLM
    constraint fields (guided.py); a 400 naming them when more than one is set.

    A required or named tool_choice beside a response_format is the tool call: the format is
    for an answer in text, which a forced call leaves out (OpenAI and vLLM answer so; DSPy's
    JSONAdapter sends both when a caller forces its native tool calls)."""
    fmt = req.response_format
    forced = plan.mode in ("required", "named")
    require_one(
        (["response_format"] if fmt is not None and fmt.type != "text" and not forced else [])
        + given_constraints(req)
        + (["tool_choice"] if forced else [])
    )
    if forced:
        tool = constraint(plan)
        return Constraint(tool.params, {"json_schema": tool.field} if tool.field else {})
    if fmt is None or fmt.type == "text":
        return body_constraint(req)
    if fmt.type == "json_object":
        # any JSON object, any depth: the engine builds this schema as a recursive grammar
        # (llguidance) and checks the output parses to an object before it is returned
        return Constraint({"json_schema": ANY_OBJECT_SCHEMA}, {})
    if fmt.json_schema is None:
        raise ApiError(
            400,
            "response_format json_schema needs its json_schema field",
            param="response_format.json_schema",
        )
    return Constraint({"json_schema": json.dumps(fmt.json_schema.schema_)}, {})


def _tool_finish(finish: dict[str, Any], result: Scan) -> dict[str, Any]:
    """OpenAI's finish reason: "tool_calls" when a call ends the turn."""
    if result.calls and finish["finish_reason"] == "stop":
        return {**finish, "finish_reason": "tool_calls"}
    return finish


def _shed(text: str, ending: tuple[str, ...]) -> str:
    """`text` without the special tokens (EOS, end of turn) that close it."""
    while ending:
        cut = next((t for t in ending if text.endswith(t)), None)
        if cut is None:
            return text
        text = text[: -len(cut)]
    return text


class _ToolChunks:
    """Converts one request's engine chunks into chat chunks with content/tool-call deltas."""

    def __init__(self, plan: ToolPlan, reply: _Reply, shed: tuple[str, ...] = ()) -> None:
        self.plan, self.reply, self.shed = plan, reply, shed
        self.deltas: dict[int, ToolDeltas] = {}

    def __call__(self, chunk: dict, first: bool) -> dict[str, Any] | None:
        i, meta = chunk["index"], chunk["meta_info"]
        finish = _finish(meta)
        final = finish["finish_reason"] is not None
        # only the last chunk ends with the EOS text (as the non-streamed answer does)
        result = scan(self.plan, _shed(chunk["text"], self.shed if final else ()), final)
        delta = self.deltas.setdefault(i, ToolDeltas()).delta(result, final)
        start = self.reply._new_logprobs(chunk)
        if not delta and not first and not final:
            return None
        choice = {
            "index": i,
            "delta": {"role": "assistant", **delta} if first else delta,
            "logprobs": _chat_logprobs(meta, start) if "output_token_logprobs" in meta else None,
            **_tool_finish(finish, result),
        }
        return self.reply.chunk([choice])
