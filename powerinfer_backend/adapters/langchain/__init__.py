"""LangChain on powerinfer_backend: ``LlamaCpp`` and ``ChatLlamaCpp``, the
``langchain_community`` classes with our ``Llama`` as their client and two more fields,
``vram_budget`` (GiB) and ``sparse``::

    from powerinfer_backend.adapters.langchain import ChatLlamaCpp, LlamaCpp

    chat = ChatLlamaCpp(model_path="model.gguf", vram_budget=4, temperature=0)
    chat.invoke("Hello")
    chat.bind_tools([get_weather], tool_choice="get_weather").invoke("Weather in Paris?")
    chat.with_structured_output(Person).invoke("Invent a person")

They are subclasses of ``langchain_community.llms.LlamaCpp`` /
``langchain_community.chat_models.ChatLlamaCpp``: everything but the construction of the
client (``invoke``, ``stream``, ``bind_tools``, ``with_structured_output``, callbacks,
token counting) is LangChain's own code calling our llama-cpp-python–compatible API.

Mapping of LangChain's model fields: ``rope_freq_base`` / ``rope_freq_scale`` at
LangChain's defaults (10000 / 1.0, which would override the model's own RoPE base in
llama.cpp) mean "from the model"; ``seed=-1`` means random; ``n_gpu_layers`` is ignored
(placement is by ``vram_budget``). ``model_kwargs`` go to ``Llama`` as they are.

The unmodified classes work too, through the llama-cpp drop-in
(``powerinfer_backend.adapters.llamacpp.install()`` before constructing them, with
``model_kwargs={"vram_budget": 4}``). For the standalone packages LangChain recommends now,
point ``langchain_openai.ChatOpenAI(base_url="http://HOST:PORT/v1")`` at
``powerinfer-backend serve`` (docs/adapters/langchain.md).
"""

from __future__ import annotations

import warnings
from typing import Any, Dict, Optional, Union

try:  # the [langchain] extra
    with warnings.catch_warnings():  # langchain-community announces its sunset on import
        warnings.simplefilter("ignore", DeprecationWarning)
        from langchain_community.chat_models.llamacpp import ChatLlamaCpp as _ChatLlamaCpp
        from langchain_community.llms.llamacpp import LlamaCpp as _LlamaCpp
    from langchain_core.utils import pre_init
    from pydantic import model_validator
except ImportError as e:
    raise ImportError(
        f"the LangChain adapter needs langchain-community and langchain-core ({e}): "
        "pip install 'powerinfer_backend[langchain]' "
        "(from a clone: pip install -e '.[langchain]')"
    ) from e

_PARAMS = (
    "rope_freq_scale",
    "rope_freq_base",
    "lora_path",
    "lora_base",
    "n_ctx",
    "n_parts",
    "seed",
    "f16_kv",
    "logits_all",
    "vocab_only",
    "use_mlock",
    "n_threads",
    "n_batch",
    "use_mmap",
    "last_n_tokens_size",
    "verbose",
)


def _make_client(get, model_kwargs: Dict[str, Any], vram_budget, sparse):
    from powerinfer_backend.llama import LLAMA_DEFAULT_SEED, Llama

    params = {k: get(k) for k in _PARAMS}
    if params["rope_freq_base"] == 10000.0:
        params["rope_freq_base"] = 0.0
    if params["rope_freq_scale"] == 1.0:
        params["rope_freq_scale"] = 0.0
    if params["seed"] is None or params["seed"] < 0:
        params["seed"] = LLAMA_DEFAULT_SEED
    params.update(vram_budget=vram_budget, sparse=sparse)
    params.update(model_kwargs or {})
    model_path = get("model_path")
    try:
        return Llama(model_path, **params)
    except Exception as e:
        raise ValueError(f"Could not load Llama model from path: {model_path}. Received error {e}") from e


def _grammar(grammar, grammar_path):
    from llama_cpp import LlamaGrammar

    if grammar and grammar_path:
        raise ValueError(f"Can only pass in one of grammar and grammar_path. Received {grammar=} and {grammar_path=}.")
    if isinstance(grammar, str):
        return LlamaGrammar.from_string(grammar)
    if grammar_path:
        return LlamaGrammar.from_file(grammar_path)
    return grammar


class LlamaCpp(_LlamaCpp):
    """``langchain_community.llms.LlamaCpp`` running on powerinfer_backend's ``Llama``."""

    vram_budget: Optional[Union[float, str]] = None  # GiB, or a size: "512MiB"
    """GPU memory for hot neurons and dense blocks, in GiB (None = CPU only)."""
    sparse: Any = "auto"
    """Sparse FFN mode: "auto", "off", "threshold", "predictor" or a sidecar path."""

    @pre_init
    def validate_environment(cls, values: Dict) -> Dict:  # replaces the parent's validator (same name)
        values["client"] = _make_client(
            values.get, values.get("model_kwargs") or {}, values.get("vram_budget"), values.get("sparse", "auto")
        )
        values["grammar"] = _grammar(values.get("grammar"), values.get("grammar_path"))
        return values

    @property
    def _llm_type(self) -> str:
        return "powerinfer_backend"


class ChatLlamaCpp(_ChatLlamaCpp):
    """``langchain_community.chat_models.ChatLlamaCpp`` running on powerinfer_backend's
    ``Llama`` (``invoke``, ``stream``, ``bind_tools``, ``with_structured_output``)."""

    vram_budget: Optional[Union[float, str]] = None  # GiB, or a size: "512MiB"
    """GPU memory for hot neurons and dense blocks, in GiB (None = CPU only)."""
    sparse: Any = "auto"
    """Sparse FFN mode: "auto", "off", "threshold", "predictor" or a sidecar path."""

    @model_validator(mode="after")
    def validate_environment(self):  # replaces the parent's validator (same name)
        self.client = _make_client(lambda k: getattr(self, k), self.model_kwargs, self.vram_budget, self.sparse)
        self.grammar = _grammar(self.grammar, self.grammar_path)
        return self

    @property
    def _llm_type(self) -> str:
        return "powerinfer_backend-chat"


__all__ = ["LlamaCpp", "ChatLlamaCpp"]
