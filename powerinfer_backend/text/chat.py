"""Chat completion through llama-cpp-python's public chat-format handlers
(``llama_cpp.llama_chat_format``): the GGUF's chat templates as Jinja2 handlers, named
formats, or the caller's handler. A handler formats the messages (tools, response_format)
and calls the model's public ``create_completion``, so chat renders from the same runner."""

from __future__ import annotations

from typing import Any, Callable, Dict


def gguf_chat_handlers(metadata: Dict[str, str], tok) -> Dict[str, Any]:
    """Handlers of the chat templates in the GGUF metadata, as llama-cpp-python names
    them: ``"chat_template.default"`` (``tokenizer.chat_template``) and
    ``"chat_template.<name>"`` for ``tokenizer.chat_template.<name>``."""
    from llama_cpp import llama_chat_format

    templates = {k[len("tokenizer.") :]: v for k, v in metadata.items() if k.startswith("tokenizer.chat_template.")}
    if "tokenizer.chat_template" in metadata:
        templates["chat_template.default"] = metadata["tokenizer.chat_template"]
    eos, bos = tok.token_eos, tok.token_bos
    eos_text = tok.token_text(eos) if eos != -1 else ""
    bos_text = tok.token_text(bos) if bos != -1 else ""
    return {
        name: llama_chat_format.Jinja2ChatFormatter(
            template=t, eos_token=eos_text, bos_token=bos_text, stop_token_ids=[eos]
        ).to_chat_handler()
        for name, t in templates.items()
    }


def check_chat_format(name: str, gguf_handlers: Dict[str, Any]) -> None:
    """``ValueError`` naming ``name`` when it is neither one of the GGUF's templates nor a
    format llama-cpp-python registered (``chatml``, ``llama-2``, ``mistral-instruct``, ...),
    so a misspelt ``chat_format`` fails at load, not at the first chat request."""
    from llama_cpp import llama_chat_format

    if name in gguf_handlers:
        return
    try:
        llama_chat_format.get_chat_completion_handler(name)
    except llama_chat_format.LlamaChatCompletionHandlerNotFoundException:
        own = f"this model's templates: {', '.join(sorted(gguf_handlers))}; " if gguf_handlers else ""
        raise ValueError(
            f"unknown chat_format {name!r} ({own}or a llama-cpp-python format name such as "
            "'chatml', 'llama-2', 'mistral-instruct'; omit it to use the GGUF's template)"
        ) from None


def chat_handler_for(llm) -> Any:
    """The handler ``llm`` chats with: its ``chat_handler``, else its GGUF template or
    the named format ``llm.chat_format``."""
    from llama_cpp import llama_chat_format

    return (
        llm.chat_handler
        or llm.chat_handlers.get(llm.chat_format)
        or llama_chat_format.get_chat_completion_handler(llm.chat_format)
    )


#: llama-cpp-python's ``create_chat_completion`` keywords and their defaults
CHAT_DEFAULTS: dict[str, Any] = dict(
    functions=None,
    function_call=None,
    tools=None,
    tool_choice=None,
    temperature=0.2,
    top_p=0.95,
    top_k=40,
    min_p=0.05,
    typical_p=1.0,
    logprobs=None,
    top_logprobs=None,
    stream=False,
    stop=[],
    seed=None,
    response_format=None,
    max_tokens=None,
    presence_penalty=0.0,
    frequency_penalty=0.0,
    repeat_penalty=1.0,
    tfs_z=1.0,
    mirostat_mode=0,
    mirostat_tau=5.0,
    mirostat_eta=0.1,
    model=None,
    logits_processor=None,
    grammar=None,
    logit_bias=None,
)


def complete(llm, messages, kwargs: Dict[str, Any]) -> Any:
    """``llm``'s chat handler (:func:`chat_handler_for`) over ``messages`` with
    ``kwargs`` on :data:`CHAT_DEFAULTS`: it formats the messages and calls
    ``llm.create_completion``.

    Raises:
        TypeError: a keyword llama-cpp-python's ``create_chat_completion`` does not take.
    """
    unknown = set(kwargs) - set(CHAT_DEFAULTS)
    if unknown:
        raise TypeError(f"create_chat_completion() got an unexpected keyword argument '{sorted(unknown)[0]}'")
    return chat_handler_for(llm)(llama=llm, messages=messages, **{**CHAT_DEFAULTS, **kwargs})


def as_openai_v1(complete: Callable[[], Any], stream: bool) -> Any:
    """``complete()``'s chat completion (or its stream) as ``openai`` types.

    Raises:
        ImportError: the openai package is not installed.
    """
    try:
        from openai.types.chat import ChatCompletion, ChatCompletionChunk
    except ImportError:
        raise ImportError(
            "To use create_chat_completion_openai_v1, you must install the openai package."
            "You can install it with `pip install openai`."
        ) from None
    if stream:
        return (ChatCompletionChunk(**chunk) for chunk in complete())
    return ChatCompletion(**complete())
