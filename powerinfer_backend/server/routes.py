"""The OpenAI-compatible endpoints: ``/v1/models``, ``/v1/completions``,
``/v1/chat/completions`` (streaming or not) and ``/v1/embeddings``, each also without
the ``/v1`` prefix. Completions are ``Llama.create_completion``'s (llama-cpp-python's
shapes), run in a slot of the worker (:mod:`.worker`); embeddings on the served Llama between batches."""

from __future__ import annotations

from typing import Callable

import numpy as np
from fastapi import Request

from .errors import APIError
from .params import check_token_ids, dumped, functions, response_format, sampling
from .prompt_key import prompt_of
from .schemas import ChatBody, CompletionBody, EmbeddingBody, chat_message
from .state import ServerState, budget_in_effect


def register_openai(app, state: ServerState) -> None:
    """Add the OpenAI endpoints for ``state``'s model to ``app``."""

    def model_card():
        llm = state.llm
        meta = {
            "n_vocab": state.n_vocab,
            "n_ctx_train": int(getattr(llm.engine, "n_ctx_train", state.n_ctx)),
            "n_ctx": state.n_ctx,
            "n_embd": int(llm.n_embd()),
            "vram_budget": budget_in_effect(llm),
            "sparse": str(llm.sparse),
            "backend": llm.backend,
        }
        return {
            "id": state.model_alias,
            "object": "model",
            "created": state.created,
            "owned_by": "powerinfer_backend",
            "meta": meta,
        }

    async def answer(request: Request, stream: bool, call: Callable):
        """``call(llm, stream)`` on the worker, in the slot chosen for its prompt: its
        chunks as SSE events, or its result."""
        prompt = prompt_of(state.llm, lambda llm: call(llm, stream))
        if stream:
            return await state.run_stream(request, lambda llm: call(llm, True), _plain, prompt=prompt)
        return _plain(await state.run_once(request, lambda llm: call(llm, False), prompt=prompt))

    @app.get("/v1/models")
    @app.get("/models")
    async def models():
        return {"object": "list", "data": [model_card()]}

    @app.post("/v1/completions")
    @app.post("/completions")
    async def completions(request: Request, b: CompletionBody):
        prompt = b.prompt
        if isinstance(prompt, list) and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise APIError(400, "only one prompt per request is supported", param="prompt")
            prompt = prompt[0]
        if isinstance(prompt, list):
            check_token_ids(prompt, state.n_vocab, "prompt token id", param="prompt")
            if b.echo:  # the library echoes prompt text (a token list is a TypeError there, as in llama-cpp-python)
                raise APIError(400, "echo needs a text prompt, not token ids", param="echo")
        kw = dict(
            sampling(b, state.llm, state.n_vocab),
            suffix=b.suffix,
            max_tokens=b.max_tokens,
            logprobs=b.logprobs,
            echo=b.echo,
            model=state.model_alias,
        )
        return await answer(request, b.stream, lambda llm, stream: llm.create_completion(prompt, stream=stream, **kw))

    @app.post("/v1/chat/completions")
    @app.post("/chat/completions")
    async def chat_completions(request: Request, b: ChatBody):
        kw = sampling(b, state.llm, state.n_vocab)
        kw.update(
            max_tokens=b.max_completion_tokens if b.max_completion_tokens is not None else b.max_tokens,
            tools=functions(b.tools),
            tool_choice=dumped(b.tool_choice),
            functions=functions(b.functions, tools=False),
            function_call=dumped(b.function_call),
            response_format=response_format(dumped(b.response_format)),
            logprobs=b.logprobs,
            top_logprobs=b.top_logprobs,
            model=state.model_alias,
        )
        messages = [chat_message(dumped(m)) for m in b.messages]
        return await answer(
            request, b.stream, lambda llm, stream: llm.create_chat_completion(messages, stream=stream, **kw)
        )

    @app.post("/v1/embeddings")
    @app.post("/embeddings")
    async def embeddings(request: Request, b: EmbeddingBody):
        inputs = [b.input] if isinstance(b.input, str) else list(b.input)

        def work(llm):
            data, total = [], 0
            for i, text in enumerate(inputs):
                emb, n = llm.embed(text, normalize=False, return_count=True)
                v = np.asarray(emb, dtype=np.float64)
                if v.ndim == 2:  # per-token (pooling NONE): mean-pooled for the OpenAI shape
                    v = v.mean(axis=0)
                norm = float(np.linalg.norm(v))
                data.append({"object": "embedding", "index": i, "embedding": (v / norm if norm else v).tolist()})
                total += n
            return {
                "object": "list",
                "data": data,
                "model": state.model_alias,
                "usage": {"prompt_tokens": total, "total_tokens": total},
            }

        return await state.run_once(request, work, exclusive=True)  # sequence 0 of the served Llama


def _plain(value):
    """``value`` with numpy scalars as Python numbers (llama-cpp-python's logprobs hold
    numpy float32s, which the JSON encoders refuse)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value
