"""llama-server's ``/completion``: its own token loop over ``Llama.generate`` (the
prompt as text or token ids, stop strings held back until they cannot match, UTF-8
pieces never split), its response and stream shapes, and per-token probabilities
(``n_probs``)."""

from __future__ import annotations

import math
import re
import time
from typing import Dict, List, Optional

import numpy as np
from fastapi import Request

from ..text.runner import Error, Stop, Token
from ..text.sampling import SamplingParams
from .errors import APIError
from .params import check_finite, check_token_ids, parse_grammar
from .schemas import LlamaCompletionBody, LlamaPrompt
from .state import ServerState


def _llama_prompt(llm, prompt, add_special: Optional[bool]):
    if isinstance(prompt, LlamaPrompt):
        if prompt.multimodal_data:
            raise APIError(400, "multimodal prompts are not supported", param="prompt")
        prompt = prompt.prompt_string
    if isinstance(prompt, str):
        return llm.tokenize(prompt.encode("utf-8"), add_bos=True if add_special is None else add_special, special=True)
    toks: List[int] = []
    for p in prompt:  # llama-server accepts token ids mixed with strings
        if isinstance(p, str):
            toks += llm.tokenize(p.encode("utf-8"), add_bos=False, special=True)
        else:
            toks.append(int(p))
    return toks


def _token_entry(llm, tok: int, logprob: float, probs: bool) -> dict:
    raw = llm.detokenize([tok], special=True)
    e = {"id": int(tok), "token": raw.decode("utf-8", "replace"), "bytes": list(raw)}
    if probs:
        e["prob"] = float(math.exp(logprob))
    else:
        e["logprob"] = float(logprob)
    return e


def _next_token_probs(llm, logits: np.ndarray, chosen: Optional[int], n_probs: int, post: bool) -> dict:
    x = logits.astype(np.float64)
    x = x - x.max()
    lp = x - np.log(np.exp(x).sum())
    top = np.argsort(-lp, kind="stable")[:n_probs]
    if chosen is None:
        chosen = int(top[0])
    out = _token_entry(llm, chosen, lp[chosen], post)
    out["top_probs" if post else "top_logprobs"] = [_token_entry(llm, int(t), lp[t], post) for t in top]
    return out


def _logit_bias(llm, lb, n_vocab: int) -> Dict[int, float]:
    """llama-server's ``logit_bias``, ``{"id or text": bias}`` or ``[[id or text, bias],
    ...]`` (a text: each of its tokens), as ``{id: bias}``; a bias of ``false`` bans the
    token."""
    bias: Dict[int, float] = {}
    for tok, v in lb.items() if isinstance(lb, dict) else lb or ():
        if isinstance(tok, str) and not re.fullmatch(r"-?[0-9]+", tok):
            ids = llm.tokenize(tok.encode("utf-8"), add_bos=False, special=False)
        else:
            ids = [int(tok)]
        check_token_ids(ids, n_vocab, "logit_bias: token id", param="logit_bias")
        for t in ids:
            bias[t] = -math.inf if v is False else float(v)
    return bias


async def llama_completion(request: Request, b: LlamaCompletionBody, state: ServerState):
    """Answer llama-server's ``/completion`` for ``b``: one JSON object, or (``stream``)
    SSE events of the text piece by piece then a final object with the stop reason and
    timings; with ``n_probs``, each token's top probabilities.

    Raises:
        APIError(400): an empty prompt, a token id out of range, a prompt that fills the
            context, a non-finite parameter or an invalid grammar.
    """
    llm = state.llm
    tokens = _llama_prompt(llm, b.prompt, b.add_special)
    if not tokens:
        raise APIError(400, "empty prompt", param="prompt")
    check_token_ids(tokens, state.n_vocab, "prompt token id", param="prompt")  # before detokenize reads them
    # the prompt as text in the final object, as llama-server reports it
    prompt_text = b.prompt if isinstance(b.prompt, str) else llm.detokenize(tokens).decode("utf-8", "replace")
    if len(tokens) >= state.n_ctx_slot:
        raise APIError(
            400,
            f"the prompt ({len(tokens)} tokens) exceeds the available context size ({state.n_ctx_slot} tokens)",
            "exceed_context_size_error",
            param="prompt",
        )
    check_finite(
        temperature=b.temperature,
        top_p=b.top_p,
        min_p=b.min_p,
        typical_p=b.typical_p,
        repeat_penalty=b.repeat_penalty,
        presence_penalty=b.presence_penalty,
        frequency_penalty=b.frequency_penalty,
    )
    bias = _logit_bias(llm, b.logit_bias, state.n_vocab)
    if b.ignore_eos:
        bias[llm.token_eos()] = -math.inf
    grammar = parse_grammar(b.grammar, llm, b.json_schema)
    seed = None if b.seed is None or b.seed < 0 or b.seed == 0xFFFFFFFF else b.seed
    stops = [b.stop] if isinstance(b.stop, str) else list(b.stop or [])
    n_predict = b.n_predict
    settings = dict(
        n_ctx=state.n_ctx_slot,
        n_predict=n_predict,
        temperature=b.temperature,
        top_k=b.top_k,
        top_p=b.top_p,
        min_p=b.min_p,
        typical_p=b.typical_p,
        repeat_penalty=b.repeat_penalty,
        presence_penalty=b.presence_penalty,
        frequency_penalty=b.frequency_penalty,
        mirostat=b.mirostat,
        seed=b.seed if b.seed is not None else 0xFFFFFFFF,
        stop=stops,
        n_probs=b.n_probs,
    )

    slot = {"id": 0}  # the slot the request runs in (llama-server's id_slot)

    def gen(llm):
        """Yield ("token", id, text, probs) per token, then ("end", the keywords of ``final``
        but the content)."""
        slot["id"] = getattr(llm, "seq", 0)
        if not b.cache_prompt:
            llm.reset()
        t0 = time.perf_counter()
        if n_predict == 0:  # just the prompt: its next-token distribution when asked
            llm.reset()
            llm.eval(tokens)
            probs = None
            if b.n_probs:
                probs = _next_token_probs(llm, llm.last_logits(), None, b.n_probs, b.post_sampling_probs)
            yield ("end", dict(stop_type="limit", word="", probs=probs, t0=t0, n_pred=0, prompt_n=len(tokens)))
            return
        if seed is not None:
            llm.set_seed(seed)
        else:
            import random

            llm.set_seed(random.Random().randint(0, 2**32 - 2))
        if bias:
            lb_arr = np.zeros(state.n_vocab, dtype=np.single)
            for t, v in bias.items():
                lb_arr[t] = v

            def processor(input_ids, scores):
                return scores + lb_arr

            processors = [processor]
        else:
            processors = None
        out = bytearray()
        emitted = 0  # bytes of `out` already sent
        n = 0
        stop_type, word = "limit", ""
        max_hold = max((len(s.encode("utf-8")) for s in stops), default=0)
        params = SamplingParams(
            top_k=b.top_k,
            top_p=b.top_p,
            min_p=b.min_p,
            typical_p=b.typical_p,
            temp=b.temperature,
            repeat_penalty=b.repeat_penalty,
            frequency_penalty=b.frequency_penalty,
            presence_penalty=b.presence_penalty,
            mirostat_mode=b.mirostat,
            mirostat_tau=b.mirostat_tau,
            mirostat_eta=b.mirostat_eta,
            logits_processor=processors,
            grammar=grammar,
        )
        # the runner's tokens; stop strings, n_predict and the context end are llama-server's rules, here
        events = llm.run(tokens, params, max_tokens=state.n_ctx_slot - len(tokens) + 1)
        for ev in events:
            if isinstance(ev, Error):
                raise ev.error
            if isinstance(ev, Stop):
                stop_type = "eos" if ev.reason == "stop" else stop_type
                break
            if not isinstance(ev, Token):
                continue
            tok = ev.token
            n += 1
            probs = None
            if b.n_probs:
                probs = _next_token_probs(llm, llm.last_logits(), tok, b.n_probs, b.post_sampling_probs)
            out += llm.detokenize([tok], prev_tokens=None, special=False)
            # stop strings: search the decoded text; hold back a possible stop prefix
            full = bytes(out)
            hit = None
            for s in stops:
                i = full.find(s.encode("utf-8"))
                if i >= 0 and (hit is None or i < hit[0]):
                    hit = (i, s)
            if hit is not None:
                piece = full[emitted : hit[0]]
                yield ("token", tok, piece, probs)
                stop_type, word = "word", hit[1]
                break
            safe = len(full) - max(0, max_hold - 1) if stops else len(full)
            safe = _utf8_boundary(full, max(safe, emitted))
            yield ("token", tok, full[emitted:safe], probs)
            emitted = safe
            if 0 < n_predict <= n or llm.n_tokens >= state.n_ctx_slot:
                break
        events.close()
        if stop_type != "word" and emitted < len(out):
            yield ("token", None, bytes(out[emitted:]), None)
        yield (
            "end",
            dict(stop_type=stop_type, word=word, probs=None, t0=t0, n_pred=n, prompt_n=llm.sequence.prompt_evaluated),
        )

    def final(stop_type, word, probs, t0, n_pred, prompt_n, content: str):
        """The last object; ``prompt_n``: prompt tokens evaluated (the rest were cached)."""
        dt = time.perf_counter() - t0
        n_eval = len(tokens)
        res = {
            "content": content,
            "id_slot": slot["id"],
            "stop": True,
            "model": state.model_alias,
            "tokens_predicted": n_pred,
            "tokens_evaluated": n_eval,
            "generation_settings": settings,
            "prompt": prompt_text,
            "has_new_line": "\n" in content,
            "truncated": False,
            "stop_type": stop_type,
            "stopping_word": word,
            "tokens_cached": n_eval + n_pred,
            "timings": {
                "prompt_n": prompt_n,
                "cache_n": n_eval - prompt_n,
                "predicted_n": n_pred,
                "predicted_ms": dt * 1e3,
                "predicted_per_second": n_pred / dt if dt > 0 else 0.0,
            },
        }
        if probs is not None:
            res["completion_probabilities"] = [probs]
        return res

    if b.stream:

        def fmt(item):
            if item[0] == "token":
                _, tok, piece, probs = item
                d = {
                    "content": piece.decode("utf-8", "replace"),
                    "tokens": [] if tok is None else [tok],
                    "stop": False,
                    "id_slot": slot["id"],
                    "index": 0,
                }
                if probs is not None:
                    d["completion_probabilities"] = [probs]
                return d
            return final(**item[1], content="")

        return await state.run_stream(request, gen, fmt, done=None, prompt=tokens)

    def collect(llm):
        pieces, toks, probs_all = [], [], []
        for item in gen(llm):
            if item[0] == "token":
                pieces.append(item[2])
                if item[1] is not None:
                    toks.append(item[1])
                if item[3] is not None:
                    probs_all.append(item[3])
            else:
                res = final(**item[1], content=b"".join(pieces).decode("utf-8", "replace"))
                res["tokens"] = toks
                if probs_all:
                    res["completion_probabilities"] = probs_all
                return res

    return await state.run_once(request, collect, prompt=tokens)


def _utf8_boundary(data: bytes, end: int) -> int:
    """The largest index <= end that does not split a UTF-8 character."""
    end = min(end, len(data))
    i = end
    while i > 0 and i > end - 4:
        c = data[i - 1]
        if c < 0x80:
            return end if i == end else i
        if c >= 0xC0:  # lead byte at i-1: complete when the character fits before `end`
            need = 2 if c < 0xE0 else 3 if c < 0xF0 else 4
            return end if (i - 1) + need <= end else i - 1
        i -= 1
    return end
