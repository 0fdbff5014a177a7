"""Request bodies (pydantic) and their reading: a JSON object validated against its body
class, every failure an :class:`APIError` 400. Extra fields are accepted and ignored, as
OpenAI clients send many."""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Type, TypeVar, Union

from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .errors import APIError


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")


B = TypeVar("B", bound=_Body)


def chat_message(m: Dict[str, Any]) -> Dict[str, Any]:
    """A chat message as the GGUF templates expect it: ``content`` a string. OpenAI
    clients send ``None`` (an assistant turn that only calls tools) or a list of parts
    (``{"type": "text", "text": ...}``); text parts are joined, others refused.

    Raises:
        APIError(400): no string role, or content of another shape.
    """
    if not isinstance(m.get("role"), str):
        raise APIError(400, "every message needs a string 'role'")
    content = m.get("content")
    if content is None:
        content = ""
    elif isinstance(content, list):
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                   for p in content):
            raise APIError(400, "message content parts must be {'type': 'text', 'text': str} (no images here)")
        content = "".join(p["text"] for p in content)
    elif not isinstance(content, str):
        raise APIError(400, "message 'content' must be a string, a list of text parts or null")
    return {**m, "content": content}


class _SamplingBody(_Body):
    """Sampling and stopping fields shared by /v1/completions and /v1/chat/completions."""

    top_p: float = 0.95
    min_p: float = 0.05
    typical_p: float = 1.0
    top_k: int = 40
    stop: Optional[Union[str, List[str]]] = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repeat_penalty: float = 1.0
    seed: Optional[int] = None
    mirostat_mode: int = 0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    logit_bias: Optional[Dict[str, float]] = None
    grammar: Optional[str] = None
    stream: bool = False
    n: int = 1
    model: Optional[str] = None


class CompletionBody(_SamplingBody):
    prompt: Union[str, List[int], List[str]] = ""
    suffix: Optional[str] = None
    max_tokens: Optional[int] = 16
    temperature: float = 0.8
    logprobs: Optional[int] = Field(default=None, ge=0)
    echo: bool = False


class ChatBody(_SamplingBody):
    messages: List[Dict[str, Any]] = Field(min_length=1)
    tools: Optional[List[Dict[str, Any]]] = None
    tool_choice: Optional[Union[str, Dict[str, Any]]] = None
    functions: Optional[List[Dict[str, Any]]] = None
    function_call: Optional[Union[str, Dict[str, Any]]] = None
    response_format: Optional[Dict[str, Any]] = None
    max_tokens: Optional[int] = None
    max_completion_tokens: Optional[int] = None
    temperature: float = 0.2
    logprobs: Optional[bool] = None
    top_logprobs: Optional[int] = Field(default=None, ge=0)


class EmbeddingBody(_Body):
    input: Union[str, List[str]]
    model: Optional[str] = None


class TokenizeBody(_Body):
    content: str
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeBody(_Body):
    tokens: List[int]


class LlamaCompletionBody(_Body):
    """llama-server's ``/completion``."""
    prompt: Union[str, List[Union[int, str]], Dict[str, Any]] = ""
    n_predict: int = -1
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    typical_p: float = 1.0
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    mirostat: int = 0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    grammar: Optional[str] = None
    json_schema: Optional[Dict[str, Any]] = None
    seed: Optional[int] = None
    ignore_eos: bool = False
    stop: Optional[Union[str, List[str]]] = None
    n_probs: int = Field(default=0, ge=0)
    post_sampling_probs: bool = False
    logit_bias: Optional[Union[List[List[Any]], Dict[str, Any]]] = None
    stream: bool = False
    cache_prompt: bool = True
    add_special: Optional[bool] = None


async def read_body(request: Request, model_cls: Type[B]) -> B:
    """The request's JSON body (empty: ``{}``) validated as ``model_cls``.

    Raises:
        APIError(400): not JSON, not an object, or fields that do not validate.
    """
    return _validate(model_cls, await _json_body(request))


def _validate(model_cls, body):
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    try:
        return model_cls.model_validate(body)
    except ValidationError as e:
        details = "; ".join(f"{'.'.join(str(x) for x in err['loc']) or 'body'}: {err['msg']}" for err in e.errors())
        raise APIError(400, f"invalid request: {details}") from None


async def _json_body(request: Request):
    raw = await request.body()
    if not raw:
        return {}
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise APIError(400, f"the request body is not valid JSON: {e}") from None
