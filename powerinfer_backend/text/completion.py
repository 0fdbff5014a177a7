"""``create_completion`` rendered from the runner's events (:mod:`.runner`) in
llama-cpp-python's result and stream-chunk shapes: prompt assembly (BOS / EOS, the
suffix's fill-in-the-middle layout), the prompt cache, the seed chain, echo and logprobs.

Each rule follows llama-cpp-python 0.3.x so results equal its own, including its
peculiarities (a suffix is laid out with token 0 as prefix / suffix / middle marker and
not appended to the text; stream logprobs count text offsets in characters while
generating and in bytes in the final flush; non-stream logprobs are numpy float32).
"""

from __future__ import annotations

import random
import sys
import time
import uuid
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Union

import numpy as np

from .detok import PieceText
from .logprobs import log_softmax, top_ids
from .runner import Delta, Error, Request, Stop, Usage, run
from .sampling import SamplingParams, logit_bias_processor
from .sequence import Sequence, common_prefix

#: the infill marker llama-cpp-python 0.3.x uses for prefix, suffix and middle
_FIM_MARKER = 0


def prompt_tokens(
    tok, prompt: Union[str, List[int]], suffix: Optional[str], spm_infill: bool
) -> Tuple[List[int], List[int]]:
    """The tokens to evaluate for ``prompt`` (text: BOS when the vocabulary adds one,
    special tokens parsed; token ids: as given) and the completion's first tokens
    ([BOS] for an empty prompt)."""
    bos, sep = tok.token_bos, tok.token_sep
    as_list = isinstance(prompt, list)
    head = [] if (as_list and suffix is None) or not tok.add_bos or bos == -1 else [bos]
    tail = (
        [] if (as_list and suffix is None) or (not tok.add_eos and sep == -1) else [sep if sep != -1 else tok.token_eos]
    )
    fim = suffix is not None
    if isinstance(prompt, list):
        body = list(prompt)
    else:
        body = tok.tokenize(prompt.encode("utf-8"), add_bos=False, special=not fim) if prompt != "" else []
    pre = ([_FIM_MARKER] if fim else []) + body
    suf: List[int] = []
    if fim:
        suf = [_FIM_MARKER]
        if suffix:
            # tokenize behind a two-token character so no space is added to the suffix
            space_prefix = tok.metadata.get("tokenizer.ggml.add_space_prefix", "true") == "true"
            text = ("☺" + suffix) if space_prefix else suffix
            suf += tok.tokenize(text.encode("utf-8"), add_bos=False, special=False)[2 if space_prefix else 0 :]
    mid = [_FIM_MARKER] if fim else []
    body = (suf + pre + mid) if spm_infill else (pre + suf + mid)
    return head + body + tail, ([] if len(prompt) > 0 else [bos])


@dataclass
class Options:
    """create_completion's arguments past the sampler's (llama-cpp-python's names)."""

    prompt: Union[str, List[int]]
    suffix: Optional[str] = None
    max_tokens: Optional[int] = 16
    logprobs: Optional[int] = None
    echo: bool = False
    stop: Any = None
    stream: bool = False
    seed: Optional[int] = None
    model: Optional[str] = None
    stopping_criteria: Optional[Callable] = None
    logit_bias: Optional[Dict[int, float]] = None


def completion(llm, tok, seq: Sequence, o: Options, params: SamplingParams) -> Iterator[dict]:
    """The completion of ``o.prompt`` on ``seq``: one result dict, or (``o.stream``) the
    stream chunks. ``llm`` provides ``model_path``, ``verbose``, ``cache``, ``perf``,
    ``spm_infill``, ``save_state`` / ``load_state``; ``tok`` the vocabulary.

    Raises (when iterated, as llama-cpp-python):
        AssertionError: a suffix that is not a str.
        ValueError: the prompt fills the context; logprobs without logits_all; an
            unparsable grammar.
        RuntimeError: an empty prompt with nothing cached.
    """
    assert o.suffix is None or o.suffix.__class__ is str
    cid, created = f"cmpl-{uuid.uuid4()}", int(time.time())
    prompt_toks, first = prompt_tokens(tok, o.prompt, o.suffix, llm.spm_infill)
    stops = [o.stop] if isinstance(o.stop, str) else list(o.stop) if isinstance(o.stop, list) else []
    stops_b = [s.encode("utf-8") for s in stops]
    model = o.model if o.model is not None else llm.model_path
    if prompt_toks[:2] == [tok.token_bos] * 2:
        warnings.warn(
            f'Detected duplicate leading "{tok.token_text(tok.token_bos)}" in prompt, this will likely '
            f"reduce response quality, consider removing it...",
            RuntimeWarning,
            stacklevel=1,
        )
    if o.logit_bias is not None:
        procs = list(params.logits_processor or ()) + [logit_bias_processor(o.logit_bias)]
        params = SamplingParams(**{**params.__dict__, "logits_processor": procs})
    if llm.verbose:
        llm.perf.reset_timings()
    n_ctx, n_prompt = seq.n_ctx, len(prompt_toks)
    if n_prompt >= n_ctx:
        raise ValueError(f"Requested tokens ({n_prompt}) exceed context window of {n_ctx}")
    max_tokens = o.max_tokens if o.max_tokens is not None and o.max_tokens > 0 else n_ctx - n_prompt
    max_tokens = min(max_tokens, n_ctx - n_prompt)
    if o.logprobs is not None and not seq.logits_all:
        raise ValueError("logprobs is not supported for models created with logits_all=False")
    _from_cache(llm, seq, prompt_toks)
    seq.seed = o.seed if o.seed is not None else random.Random(seq.seed).randint(0, 2**32)
    text = PieceText(tok.piece, tok.token_bos)
    for t in first:
        text.append(t)
    req = Request(
        prompt_toks,
        params,
        text,
        max_tokens,
        tok.is_eog,
        stops_b,
        stream=("tokens" if o.logprobs is not None else "chars") if o.stream else None,
        stopping_criteria=o.stopping_criteria,
    )
    head = {"id": cid, "object": "text_completion", "created": created, "model": model}
    stop = None
    for ev in run(seq, req):
        if isinstance(ev, Delta):
            lp = _stream_logprobs(tok, seq, o, n_prompt, text, ev) if o.logprobs is not None else None
            yield {**head, "choices": [{"text": ev.text, "index": 0, "logprobs": lp, "finish_reason": None}]}
        elif isinstance(ev, Stop):
            stop = ev
            if llm.verbose:
                llm.perf.print_timings()
        elif isinstance(ev, Usage):
            usage = {
                "prompt_tokens": ev.prompt_tokens,
                "completion_tokens": ev.completion_tokens,
                "total_tokens": ev.prompt_tokens + ev.completion_tokens,
            }
        elif isinstance(ev, Error):
            raise ev.error
    assert stop is not None  # run() ends with a Stop unless it raised
    if o.stream:
        yield {**head, "choices": [{"text": "", "index": 0, "logprobs": None, "finish_reason": stop.reason}]}
        _to_cache(llm, prompt_toks + text.tokens)
        return
    _to_cache(llm, prompt_toks + text.tokens)
    out = stop.text.decode("utf-8", "ignore")
    if o.echo:
        echoed: Any = o.prompt  # a token-list prompt raises TypeError here, as in llama-cpp-python
        out = echoed + out
    lp = _logprobs(tok, seq, o, prompt_toks, text.tokens) if o.logprobs is not None else None
    yield {**head, "choices": [{"text": out, "index": 0, "logprobs": lp, "finish_reason": stop.reason}], "usage": usage}


def _from_cache(llm, seq: Sequence, prompt_toks: List[int]) -> None:
    """Load the prompt cache's state for ``prompt_toks`` when it shares more than the sequence."""
    if not llm.cache:
        return
    try:
        item = llm.cache[prompt_toks]
    except KeyError:
        if llm.verbose:
            print("Llama.create_completion: cache miss", file=sys.stderr)
        return
    if common_prefix(item.input_ids.tolist(), prompt_toks) > common_prefix(seq.tokens.tolist(), prompt_toks):
        llm.load_state(item)
        if llm.verbose:
            print("Llama.create_completion: cache hit", file=sys.stderr)


def _to_cache(llm, tokens: List[int]) -> None:
    if llm.cache:
        llm.cache[tokens] = llm.save_state()


def _top(tok, row: np.ndarray, n: int, chosen: int, chosen_str: str, as_float: bool) -> dict:
    vals = row.tolist() if as_float else row
    top = {tok.detokenize([int(i)]).decode("utf-8", "ignore"): vals[int(i)] for i in top_ids(row, n)}
    top[chosen_str] = vals[chosen]
    return top


def _stream_logprobs(tok, seq: Sequence, o: Options, n_prompt: int, text: PieceText, ev: Delta) -> dict:
    """One streamed token's logprobs entry (offsets in characters while generating, in
    bytes in the final flush, as llama-cpp-python)."""
    before = text.span(0, ev.index)
    offset = len(o.prompt) + (len(before) if ev.final else len(before.decode("utf-8", "ignore")))
    row = log_softmax(seq.scores[n_prompt + ev.index - 1])
    tok_str = tok.detokenize([ev.token]).decode("utf-8", "ignore")
    vals = row.tolist()
    return {
        "tokens": [tok_str],
        "text_offset": [offset],
        "token_logprobs": [vals[ev.token]],
        "top_logprobs": [_top(tok, row, o.logprobs or 0, ev.token, tok_str, True)],
    }


def _logprobs(tok, seq: Sequence, o: Options, prompt_toks: List[int], completion: List[int]) -> dict:
    """The result's logprobs: per completion token (with ``echo``, per prompt token too,
    the first one's null), each with its top ``o.logprobs`` alternatives."""
    bos = tok.token_bos
    if o.echo:
        toks = prompt_toks[1 if prompt_toks[0] == bos else 0 :] + completion
        text_offset, row0 = 0, 0
    else:
        toks = completion
        text_offset, row0 = len(o.prompt), len(prompt_toks[1:])
    rows = log_softmax(seq.rows())[row0:]
    joined = PieceText(tok.piece, bos)
    offsets: List[int] = []
    strs: List[str] = []
    token_lps: List[Optional[Any]] = []
    tops: List[Optional[dict]] = []
    for idx, (t, row) in enumerate(zip(toks, rows)):
        if idx:
            joined.append(toks[idx - 1])
        if t == bos:
            continue
        s = tok.detokenize([t]).decode("utf-8", "ignore")
        offsets.append(text_offset + len(joined.text().decode("utf-8", "ignore")))
        strs.append(s)
        token_lps.append(row[t])
        tops.append(_top(tok, row, o.logprobs or 0, t, s, False))
    if o.echo and toks:
        token_lps[0] = tops[0] = None
    return {"tokens": strs, "text_offset": offsets, "token_logprobs": token_lps, "top_logprobs": tops}
