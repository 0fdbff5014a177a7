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

    templates = {k[len("tokenizer."):]: v for k, v in metadata.items() if k.startswith("tokenizer.chat_template.")}
    if "tokenizer.chat_template" in metadata:
        templates["chat_template.default"] = metadata["tokenizer.chat_template"]
    eos, bos = tok.token_eos, tok.token_bos
    eos_text = tok.token_text(eos) if eos != -1 else ""
    bos_text = tok.token_text(bos) if bos != -1 else ""
    return {name: llama_chat_format.Jinja2ChatFormatter(template=t, eos_token=eos_text, bos_token=bos_text,
                                                        stop_token_ids=[eos]).to_chat_handler()
            for name, t in templates.items()}


def chat_handler_for(llm) -> Any:
    """The handler ``llm`` chats with: its ``chat_handler``, else its GGUF template or
    the named format ``llm.chat_format``."""
    from llama_cpp import llama_chat_format

    return (llm.chat_handler or llm.chat_handlers.get(llm.chat_format)
            or llama_chat_format.get_chat_completion_handler(llm.chat_format))


def as_openai_v1(complete: Callable[[], Any], stream: bool) -> Any:
    """``complete()``'s chat completion (or its stream) as ``openai`` types.

    Raises:
        ImportError: the openai package is not installed.
    """
    try:
        from openai.types.chat import ChatCompletion, ChatCompletionChunk
    except ImportError:
        raise ImportError("To use create_chat_completion_openai_v1, you must install the openai package."
                          "You can install it with `pip install openai`.") from None
    if stream:
        return (ChatCompletionChunk(**chunk) for chunk in complete())
    return ChatCompletion(**complete())
