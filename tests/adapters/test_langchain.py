"""LangChain with the real packages: ``LlamaCpp`` / ``ChatLlamaCpp`` on our ``Llama`` (the
adapter's subclasses and the unmodified classes through the llama-cpp drop-in), and
``langchain_openai.ChatOpenAI`` against ``powerinfer-backend serve`` over loopback."""

from __future__ import annotations

import warnings

import pytest

pytest.importorskip("langchain_core")
with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    pytest.importorskip("langchain_community")

from pydantic import BaseModel

from powerinfer_backend import Llama

PROMPT = "The capital of France is"


def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    return "sunny"


class Person(BaseModel):
    """A person."""

    name: str
    age: int


@pytest.fixture(scope="module")
def ref(model_path):
    with Llama(model_path, n_ctx=512, n_threads=1, verbose=False) as llm:
        yield llm


@pytest.fixture(scope="module")
def chat(model_path):
    from powerinfer_backend.adapters.langchain import ChatLlamaCpp

    m = ChatLlamaCpp(
        model_path=model_path,
        n_ctx=512,
        n_threads=1,
        n_batch=64,
        temperature=0,
        max_tokens=24,
        repeat_penalty=1.0,
        verbose=False,
        vram_budget=1.5,
        sparse="off",
    )
    yield m
    m.client.close()


def test_llm_invoke_and_stream(model_path, ref):
    from powerinfer_backend.adapters.langchain import LlamaCpp

    llm = LlamaCpp(
        model_path=model_path,
        n_ctx=512,
        n_threads=1,
        temperature=0,
        max_tokens=8,
        repeat_penalty=1.0,
        verbose=False,
        vram_budget="2GiB",
    )  # a size, as serve and Llama take it
    try:
        assert isinstance(llm.client, Llama) and llm.client.vram_budget == "2GiB"
        want = ref(PROMPT, max_tokens=8, temperature=0)["choices"][0]["text"]
        assert llm.invoke(PROMPT) == want
        chunks = list(llm.stream(PROMPT))
        assert len(chunks) >= 8 and "".join(chunks) == want
        assert llm.get_num_tokens(PROMPT) == len(ref.tokenize(PROMPT.encode()))
    finally:
        llm.client.close()


def test_chat_invoke_and_stream(chat, ref):
    assert isinstance(chat.client, Llama) and chat.client.vram_budget == 1.5 and chat.client.sparse == "off"
    msgs = [{"role": "user", "content": "Say hello."}]
    want = ref.create_chat_completion(msgs, max_tokens=24, temperature=0)["choices"][0]["message"]["content"]
    assert chat.invoke("Say hello.").content == want
    parts = [c.content for c in chat.stream("Say hello.")]
    assert len(parts) > 3 and "".join(parts) == want


def test_chat_bind_tools(chat):
    # ChatLlamaCpp forces a tool by dict or True (a bare name is passed on as is, which
    # llama-cpp-python treats as "auto": no forced call)
    for choice in ({"type": "function", "function": {"name": "get_weather"}}, True):
        msg = chat.bind_tools([get_weather], tool_choice=choice).invoke("What is the weather in Paris?")
        assert msg.tool_calls and msg.tool_calls[0]["name"] == "get_weather"
        assert isinstance(msg.tool_calls[0]["args"]["city"], str)


def test_chat_with_structured_output(chat):
    p = chat.with_structured_output(Person).invoke("Invent a person.")
    assert isinstance(p, Person) and isinstance(p.age, int)


def test_unmodified_classes_through_the_dropin(model_path, ref):
    """langchain_community's own classes, untouched, after llamacpp.install()."""
    from langchain_community.llms import LlamaCpp

    from powerinfer_backend.adapters import llamacpp

    llamacpp.install()
    try:
        llm = LlamaCpp(
            model_path=model_path,
            n_ctx=512,
            n_threads=1,
            temperature=0,
            max_tokens=8,
            repeat_penalty=1.0,
            verbose=False,
            rope_freq_base=0,
            rope_freq_scale=0,
            model_kwargs={"vram_budget": 3},
        )
    finally:
        llamacpp.uninstall()
    try:
        assert isinstance(llm.client, Llama) and llm.client.vram_budget == 3
        assert llm.invoke(PROMPT) == ref(PROMPT, max_tokens=8, temperature=0)["choices"][0]["text"]
    finally:
        llm.client.close()


# ---- langchain_openai.ChatOpenAI against our server ---------------------------------------


@pytest.fixture(scope="module")
def openai_chat(model_path):
    pytest.importorskip("langchain_openai")
    pytest.importorskip("fastapi")
    from langchain_openai import ChatOpenAI

    from tests.fixtures.server import ServerProcess

    s = ServerProcess("--model", model_path, "--ctx-size", "512")
    try:
        yield ChatOpenAI(
            base_url=s.url + "/v1",
            api_key="none",
            model="smollm2",
            temperature=0,
            max_tokens=24,
            max_retries=0,
            timeout=120,
        )
    finally:
        s.close()


def test_chat_openai_invoke_and_stream(openai_chat, ref):
    want = ref.create_chat_completion([{"role": "user", "content": "Say hello."}], max_tokens=24, temperature=0)[
        "choices"
    ][0]["message"]["content"]
    assert openai_chat.invoke("Say hello.").content == want
    parts = [c.content for c in openai_chat.stream("Say hello.")]
    assert len(parts) > 3 and "".join(parts) == want


def test_chat_openai_tool_calling(openai_chat):
    msg = openai_chat.bind_tools([get_weather], tool_choice="get_weather").invoke("What is the weather in Paris?")
    assert msg.tool_calls and msg.tool_calls[0]["name"] == "get_weather"
    assert isinstance(msg.tool_calls[0]["args"]["city"], str)
    p = openai_chat.with_structured_output(Person, method="json_schema").invoke("Invent a person.")
    assert isinstance(p, Person)
    p = openai_chat.with_structured_output(Person, method="function_calling").invoke("Invent a person.")
    assert isinstance(p, Person)
