"""The structured-output clients users already have, unmodified, against our server: the
`openai` client's `.parse`, instructor (TOOLS, JSON_SCHEMA, JSON) and langchain-openai's
`with_structured_output` (json_schema, function_calling). Each returns a validated object."""

from __future__ import annotations

import instructor
import pytest
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field


class Person(BaseModel):
    """A person mentioned in the text."""

    name: str = Field(max_length=16)
    age: int = Field(ge=0, le=120)


class Loose(BaseModel):
    """Every field optional: the 135M model answers `{}` when the schema is only in the prompt."""

    name: str | None = None
    age: int | None = None


PROMPT = "Extract the person: Alice is 30 years old."


def ask(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def test_openai_parse_with_a_pydantic_response_format(client):
    reply = client.chat.completions.parse(
        model="default",
        messages=ask(PROMPT),
        response_format=Person,
        max_tokens=40,
        temperature=0,
    )
    person = reply.choices[0].message.parsed
    assert isinstance(person, Person) and person.name and 0 <= person.age <= 120


@pytest.mark.parametrize("mode", [instructor.Mode.TOOLS, instructor.Mode.JSON_SCHEMA])
def test_instructor_returns_a_validated_model(client, mode):
    patched = instructor.from_openai(client, mode=mode)
    person, completion = patched.chat.completions.create_with_completion(
        model="default",
        messages=ask(PROMPT),
        response_model=Person,
        max_tokens=40,
        temperature=0,
        max_retries=0,
    )
    assert isinstance(person, Person) and person.name and 0 <= person.age <= 120
    message = completion.choices[0].message
    if mode is instructor.Mode.TOOLS:
        assert message.tool_calls[0].function.name == "Person"
        assert completion.choices[0].finish_reason == "tool_calls"


def test_instructor_json_mode_round_trips_a_json_object(client):
    patched = instructor.from_openai(client, mode=instructor.Mode.JSON)
    loose, completion = patched.chat.completions.create_with_completion(
        model="default",
        messages=ask(PROMPT),
        response_model=Loose,
        max_tokens=40,
        temperature=0,
        max_retries=0,
    )
    assert isinstance(loose, Loose)
    assert completion.choices[0].message.content.lstrip().startswith("{")


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_langchain_structured_output(url, method):
    llm = ChatOpenAI(
        model="default",
        base_url=f"{url}/v1",
        api_key="unused",
        max_tokens=40,
        temperature=0,
        max_retries=0,
        timeout=120,
    )
    person = llm.with_structured_output(Person, method=method).invoke(PROMPT)
    assert isinstance(person, Person) and person.name and 0 <= person.age <= 120
