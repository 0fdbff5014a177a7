"""Request bodies, declared (pydantic; FastAPI validates them and puts them in the
OpenAPI document): OpenAI's fields for ``/v1/completions``, ``/v1/chat/completions`` and
``/v1/embeddings``, llama-server's for ``/completion``, ``/tokenize`` and
``/detokenize``.

Declared fields are strict, as OpenAI is: JSON types as declared, nothing coerced
(``"5"`` is not an integer, ``1`` not a boolean), no NaN / infinity, OpenAI's ranges
(``max_tokens`` >= 0, ``temperature`` in [0, 2], ...), chat roles from OpenAI's list,
``content`` where the role needs it. Unknown fields are accepted and ignored, as OpenAI
and llama-server do (clients send many). A failure is a 400 naming the field
(:func:`.errors.validation_error`)."""

from __future__ import annotations

from typing import Any, Dict, List, Literal, Optional, Tuple, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator
from typing_extensions import Annotated

from .errors import APIError


# Integers llama.cpp's C API takes (int32_t there), with their lower bounds. (A bound set
# again by a field's own ``Field(ge=...)`` would not override these.)
Int32 = Annotated[int, Field(ge=-(2**31), le=2**31 - 1)]
NonNegativeInt32 = Annotated[int, Field(ge=0, le=2**31 - 1)]
NPredict = Annotated[int, Field(ge=-2, le=2**31 - 1)]  # -1: no limit, -2: until the context is full
Seed = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]
NonEmptyStr = Annotated[str, Field(min_length=1)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)


def chat_message(m: Dict[str, Any]) -> Dict[str, Any]:
    """A chat message as the GGUF templates expect it: ``content`` a string. OpenAI
    clients send ``None`` (an assistant turn that only calls tools) or a list of parts
    (``{"type": "text", "text": ...}``); text parts are joined, others refused.

    Raises:
        APIError(400): no string role, or content of another shape.
    """
    if not isinstance(m.get("role"), str):
        raise APIError(400, "every message needs a string 'role'", param="messages")
    content = m.get("content")
    if content is None:
        content = ""
    elif isinstance(content, list):
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
            raise APIError(
                400, "message content parts must be {'type': 'text', 'text': str} (no images here)", param="messages"
            )
        content = "".join(p["text"] for p in content)
    elif not isinstance(content, str):
        raise APIError(400, "message 'content' must be a string, a list of text parts or null", param="messages")
    return {**m, "content": content}


# ---- chat messages (OpenAI's roles) -------------------------------------------------------


class TextPart(_Body):
    """A content part; only text is served here (no images, audio or files)."""

    type: Literal["text"]
    text: str


Content = Union[str, List[TextPart]]


class FunctionCallMessage(_Body):
    name: str
    arguments: str


class ToolCall(_Body):
    id: str
    type: Literal["function"]
    function: FunctionCallMessage


class SystemMessage(_Body):
    role: Literal["system"]
    content: Content
    name: Optional[str] = None


class DeveloperMessage(_Body):
    role: Literal["developer"]
    content: Content
    name: Optional[str] = None


class UserMessage(_Body):
    role: Literal["user"]
    content: Content
    name: Optional[str] = None


class AssistantMessage(_Body):
    """``content`` may be left out (or null) only when the turn calls tools, as OpenAI."""

    model_config = ConfigDict(
        json_schema_extra={
            "anyOf": [
                {"required": ["content"], "properties": {"content": {"not": {"type": "null"}}}},
                {"required": ["tool_calls"], "properties": {"tool_calls": {"type": "array"}}},
                {"required": ["function_call"], "properties": {"function_call": {"type": "object"}}},
            ]
        }
    )

    role: Literal["assistant"]
    content: Optional[Content] = None
    name: Optional[str] = None
    refusal: Optional[str] = None
    tool_calls: Optional[List[ToolCall]] = None
    function_call: Optional[FunctionCallMessage] = None

    @model_validator(mode="after")
    def _content_or_calls(self):
        if self.content is None and self.tool_calls is None and self.function_call is None:
            raise ValueError("an assistant message needs 'content' unless it has 'tool_calls' or 'function_call'")
        return self


class ToolMessage(_Body):
    role: Literal["tool"]
    content: Content
    tool_call_id: str


class FunctionMessage(_Body):
    role: Literal["function"]
    content: Optional[str]
    name: str


Message = Annotated[
    Union[SystemMessage, DeveloperMessage, UserMessage, AssistantMessage, ToolMessage, FunctionMessage],
    Field(discriminator="role"),
]


# ---- tools and response formats ------------------------------------------------------------


class FunctionDef(_Body):
    name: str
    description: Optional[str] = None
    parameters: Optional[Dict[str, Any]] = None  # a JSON schema; left out: no parameters
    strict: Optional[bool] = None


class Tool(_Body):
    type: Literal["function"]
    function: FunctionDef


class FunctionName(_Body):
    name: str


class NamedToolChoice(_Body):
    type: Literal["function"]
    function: FunctionName


class JSONSchemaFormat(_Body):
    name: str
    description: Optional[str] = None
    schema_: Optional[Dict[str, Any]] = Field(default=None, alias="schema")
    strict: Optional[bool] = None


class ResponseFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: Optional[JSONSchemaFormat] = None
    schema_: Optional[Dict[str, Any]] = Field(default=None, alias="schema")  # llama-cpp-python's json_object


# ---- OpenAI bodies -------------------------------------------------------------------------


class _SamplingBody(_Body):
    """Sampling and stopping fields shared by /v1/completions and /v1/chat/completions
    (OpenAI's, then llama-cpp-python's extensions)."""

    model: Optional[str] = None
    top_p: float = Field(default=0.95, ge=0, le=1)
    stop: Optional[Union[str, List[str]]] = None
    frequency_penalty: float = Field(default=0.0, ge=-2, le=2)
    presence_penalty: float = Field(default=0.0, ge=-2, le=2)
    seed: Optional[Seed] = None
    logit_bias: Optional[Dict[str, float]] = None
    stream: bool = False
    n: int = Field(default=1, ge=1, le=128)
    user: Optional[str] = None
    # llama-cpp-python's
    min_p: float = 0.05
    typical_p: float = 1.0
    top_k: Int32 = 40
    repeat_penalty: float = 1.0
    mirostat_mode: int = Field(default=0, ge=0, le=2)
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    grammar: Optional[str] = None


class CompletionBody(_SamplingBody):
    prompt: Union[str, Annotated[List[Int32], Field(min_length=1)], Annotated[List[str], Field(min_length=1)]] = ""
    suffix: Optional[str] = None
    max_tokens: Optional[NonNegativeInt32] = 16  # 0 or null: no limit but EOS, a stop, the context (llama-cpp-python's)
    temperature: float = Field(default=0.8, ge=0, le=2)
    logprobs: Optional[int] = Field(default=None, ge=0, le=5)
    echo: bool = False


class ChatBody(_SamplingBody):
    messages: List[Message] = Field(min_length=1)
    tools: Optional[List[Tool]] = None
    tool_choice: Optional[Union[Literal["none", "auto", "required"], NamedToolChoice]] = None
    parallel_tool_calls: Optional[bool] = None
    functions: Optional[List[FunctionDef]] = None
    function_call: Optional[Union[Literal["none", "auto"], FunctionName]] = None
    response_format: Optional[ResponseFormat] = None
    max_tokens: Optional[NonNegativeInt32] = None  # as CompletionBody's; default: no limit
    max_completion_tokens: Optional[NonNegativeInt32] = None
    temperature: float = Field(default=0.2, ge=0, le=2)
    logprobs: Optional[bool] = None
    top_logprobs: Optional[int] = Field(default=None, ge=0, le=20)


class EmbeddingBody(_Body):
    input: Union[NonEmptyStr, Annotated[List[NonEmptyStr], Field(min_length=1, max_length=2048)]]
    model: Optional[str] = None
    encoding_format: Optional[Literal["float", "base64"]] = None  # answered as floats (clients read both)
    user: Optional[str] = None


# ---- llama-server bodies -------------------------------------------------------------------


class TokenizeBody(_Body):
    content: str
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeBody(_Body):
    tokens: List[Int32]


class LlamaPrompt(_Body):
    """llama-server's multimodal prompt object (only its text is served here)."""

    prompt_string: str
    multimodal_data: Optional[List[str]] = None


#: a bias, or ``false`` to ban the token
Bias = Union[float, Literal[False]]


class LlamaCompletionBody(_Body):
    """llama-server's ``/completion``."""

    prompt: Union[str, List[Union[Int32, str]], LlamaPrompt] = ""
    n_predict: NPredict = -1
    temperature: float = 0.8
    top_k: Int32 = 40
    top_p: float = 0.95
    min_p: float = 0.05
    typical_p: float = 1.0
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    mirostat: int = Field(default=0, ge=0, le=2)
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    grammar: Optional[str] = None
    json_schema: Optional[Dict[str, Any]] = None
    seed: Optional[Seed] = None
    ignore_eos: bool = False
    stop: Optional[Union[str, List[str]]] = None
    n_probs: NonNegativeInt32 = 0
    post_sampling_probs: bool = False
    # [[token id or text, bias], ...] or {"token id or text": bias}; a pair arrives as a JSON
    # array, which only a lax tuple accepts (its items stay strict)
    logit_bias: Optional[
        Union[List[Annotated[Tuple[Union[Int32, str], Bias], Field(strict=False)]], Dict[str, Bias]]
    ] = None
    stream: bool = False
    cache_prompt: bool = True
    add_special: Optional[bool] = None
