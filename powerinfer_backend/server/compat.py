"""The llama-server-compatible endpoints (what text-generation-webui and llama.cpp's
clients call): ``/health``, ``/props``, ``/stats``, ``/slots``, ``/tokenize``, ``/detokenize`` and
``/completion`` (:mod:`.llama_completion`)."""

from __future__ import annotations

from typing import List, Union

from fastapi import Request

from .. import __version__
from .llama_completion import llama_completion
from .params import check_token_ids
from .schemas import DetokenizeBody, LlamaCompletionBody, TokenizeBody
from .state import ServerState, budget_in_effect


def register_llama_server(app, state: ServerState) -> None:
    """Add the llama-server endpoints for ``state``'s model to ``app``."""

    @app.get("/health")
    @app.get("/v1/health")
    async def health():
        return {"status": "ok"}

    def stats():
        try:
            return state.llm.stats()
        except Exception:  # e.g. the context is busy in a backend that refuses concurrent reads
            return {}

    @app.get("/props")
    async def props():
        llm = state.llm
        bos = eos = ""
        try:
            bos = (
                llm.detokenize([llm.token_bos()], special=True).decode("utf-8", "replace")
                if llm.token_bos() >= 0
                else ""
            )
            eos = (
                llm.detokenize([llm.token_eos()], special=True).decode("utf-8", "replace")
                if llm.token_eos() >= 0
                else ""
            )
        except Exception:
            pass
        return {
            # llama-server's convention: n_ctx is the total, each of total_slots gets n_ctx / total_slots
            "default_generation_settings": {
                "n_ctx": state.n_ctx_slot,
                "model": state.model_alias,
                "params": {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "n_predict": -1},
            },
            "total_slots": state.worker.parallel,
            "n_ctx": state.n_ctx,
            "n_ctx_slot": state.n_ctx_slot,
            "model_path": getattr(llm, "model_path", ""),
            "model_alias": state.model_alias,
            "chat_template": llm.metadata.get("tokenizer.chat_template", ""),
            "bos_token": bos,
            "eos_token": eos,
            "build_info": f"powerinfer_backend {__version__}",
            "vram_budget": budget_in_effect(llm),
            "sparse": str(llm.sparse),
            "stats": stats(),
            "queue": {"waiting": state.worker.waiting, "busy": state.worker.busy, "max_queue": state.worker.max_queue},
        }

    @app.get("/stats")
    async def stats_endpoint():
        w = state.worker
        return {
            "sparsity": stats(),
            "served": w.served,
            "cancelled": w.cancelled,
            "rejected": w.rejected,
            "waiting": w.waiting,
            "busy": w.busy,
            "max_queue": w.max_queue,
            "total_slots": w.parallel,
            "slots_processing": sum(s["is_processing"] for s in w.slots()),
            "steps": w.steps,
            "tokens_decoded": w.tokens_decoded,
            "eval_s": w.eval_s,
            "cancel_steps": [list(c) for c in w.cancel_steps],
        }

    @app.get("/slots")
    async def slots():
        """Per slot: id, is_processing, n_ctx (its share) and n_past (tokens it holds)."""
        return state.worker.slots()

    @app.post("/tokenize")
    @app.post("/extras/tokenize")
    async def tokenize(b: TokenizeBody):
        toks = state.llm.tokenize(b.content.encode("utf-8"), add_bos=b.add_special, special=b.parse_special)
        if b.with_pieces:
            pieces = []
            for t in toks:
                raw = state.llm.detokenize([t], special=True)
                try:
                    piece: Union[str, List[int]] = raw.decode("utf-8")
                except UnicodeDecodeError:
                    piece = list(raw)
                pieces.append({"id": t, "piece": piece})
            return {"tokens": pieces}
        return {"tokens": toks}

    @app.post("/detokenize")
    @app.post("/extras/detokenize")
    async def detokenize(b: DetokenizeBody):
        check_token_ids(b.tokens, state.n_vocab, param="tokens")
        return {"content": state.llm.detokenize(b.tokens, special=True).decode("utf-8", "replace")}

    @app.post("/completion")
    @app.post("/v1/completion")
    async def completion(request: Request, b: LlamaCompletionBody):
        return await llama_completion(request, b, state)
