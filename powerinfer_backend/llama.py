"""``Llama``: the llama-cpp-python-compatible high-level class over a backend.

Design (docs/architecture.md): an own class, not a subclass of ``llama_cpp.Llama``
(whose ``__init__`` builds a full llama.cpp context); it reuses llama-cpp-python's
public pieces - the tokenizer (vocab-only llama.cpp), result shapes - and computes
logits with the native engine through the ``"hybrid"`` backend plugin.
"""

from __future__ import annotations

import math
import os
import time
import uuid
import warnings
from typing import Iterator, List, Optional, Sequence, Union

import numpy as np

from .backends import create_backend
from .sampling import SamplingParams, sample_token
from .tokenizer import LlamaCppTokenizer

LLAMA_DEFAULT_SEED = 0xFFFFFFFF  # llama.cpp's "pick a random seed"

# Accepted for llama_cpp.Llama compatibility; meaningless here (GPU placement is vram_budget).
_GPU_PARAMS = ("n_gpu_layers", "split_mode", "main_gpu", "tensor_split", "offload_kqv")


def _utf8_complete_end(data: bytes, end: int) -> int:
    """Largest e <= end such that data[:e] does not end inside a UTF-8 sequence."""
    i = end - 1
    while i >= 0 and i >= end - 4 and (data[i] & 0xC0) == 0x80:
        i -= 1
    if i < 0 or i < end - 4:
        return end
    lead = data[i]
    need = 1 if lead < 0x80 else 2 if lead >> 5 == 0x6 else 3 if lead >> 4 == 0xE else 4 if lead >> 3 == 0x1E else 1
    return end if end - i >= need else i


def _stop_hold(text: bytes, stops: Sequence[bytes]) -> int:
    """Bytes at the end of ``text`` that could begin a stop sequence (held back when streaming)."""
    hold = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), hold, -1):
            if text.endswith(s[:k]):
                hold = k
                break
    return hold


class _ClosedPart:
    """Stands in for the backend and tokenizer after :meth:`Llama.close`: any use
    raises a clear error instead of an AttributeError on None (or a use-after-free)."""

    def __getattr__(self, name):
        raise RuntimeError("Llama: the model is closed (close() was called or its `with` block ended)")


_CLOSED = _ClosedPart()


class Llama:
    """Load a GGUF model and generate text, with llama-cpp-python's API.

    Args:
        model_path: path of a GGUF file.
        n_ctx: context length in tokens (0 = the model's training context).
        n_threads: compute threads (None = the CPUs available to this process).
        n_batch: most prompt tokens per native call.
        seed: sampling seed (0xFFFFFFFF = random, as llama.cpp).
        vram_budget: GPU memory for hot neurons and dense blocks, in GiB (None or 0
            = CPU only; the GPU path arrives with the hybrid executor).
        logits_all: keep logits for every position (needed by ``logprobs``).
        verbose: print load information to stderr.
        backend: name of a registered backend plugin (default ``"hybrid"``).
        sparse: sparse FFN mode: "auto" (the calibration sidecar when present, exact
            zeros for ReLU models, else dense), "off", "threshold", "predictor", or
            a sidecar path (:mod:`powerinfer_backend.sparsity`).
        **kwargs: any other ``llama_cpp.Llama`` parameter; GPU-layer ones are ignored
            with a warning, unknown ones are tolerated.

    Raises:
        ValueError: missing or malformed model file, bad parameter.
    """

    def __init__(self, model_path: str, *, n_ctx: int = 512, n_threads: Optional[int] = None,
                 n_batch: int = 512, seed: int = LLAMA_DEFAULT_SEED, vram_budget: Optional[float] = None,
                 logits_all: bool = False, verbose: bool = True, backend: str = "hybrid", sparse="auto",
                 **kwargs):
        if not os.path.exists(model_path):
            raise ValueError(f"Model path does not exist: {model_path}")
        if n_ctx < 0:
            raise ValueError(f"n_ctx must be >= 0 (0 = the model's training context), got {n_ctx}")
        if n_batch < 1:
            raise ValueError(f"n_batch must be >= 1, got {n_batch}")
        if n_threads is not None and n_threads < 1:
            n_threads = None  # llama-cpp-python treats -1 / 0 as "default"
        gpu = [k for k in _GPU_PARAMS if k in kwargs]
        if gpu:
            warnings.warn(f"{', '.join(gpu)} ignored: powerinfer_backend places layers by vram_budget (GiB)",
                          stacklevel=2)
        self.model_path = model_path
        self.verbose = verbose
        self.vram_budget = vram_budget
        self._logits_all = logits_all
        if vram_budget is not None and not (isinstance(vram_budget, (int, float)) and vram_budget >= 0):
            raise ValueError(f"vram_budget must be a number of GiB >= 0 or None, got {vram_budget!r}")
        # the backend first: it validates the GGUF with messages naming the file and tensor
        self._backend = create_backend(backend, model_path, n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads,
                                       vram_budget=vram_budget, verbose=verbose, sparse=sparse)
        self._tok = LlamaCppTokenizer(model_path)
        self.n_batch = n_batch  # as llama_cpp.Llama exposes it
        self.n_threads = getattr(self._backend, "n_threads", n_threads)
        self._input_ids: List[int] = []
        self._last_logits: Optional[np.ndarray] = None
        self._pieces: dict = {}
        self._eog: dict = {}
        self.set_seed(seed)

    def stats(self, reset: bool = False) -> dict:
        """Measured FFN sparsity since load (or the last ``reset``): ``{"mode",
        "ffn_sparsity", "layers", ...}`` (:func:`powerinfer_backend.sparsity.stats`);
        ``{}`` for a backend without statistics."""
        fn = getattr(self._backend, "stats", None)
        return fn(reset=reset) if fn is not None else {}

    # ---- properties ---------------------------------------------------------

    def n_ctx(self) -> int:
        """Context length in tokens."""
        return self._backend.n_ctx

    def n_embd(self) -> int:
        return self._backend.n_embd

    def n_vocab(self) -> int:
        return self._backend.n_vocab

    def token_bos(self) -> int:
        return self._tok.token_bos

    def token_eos(self) -> int:
        return self._tok.token_eos

    def token_nl(self) -> int:
        return self._tok.token_nl

    @property
    def metadata(self) -> dict:
        """GGUF metadata as ``{key: str}`` (llama.cpp's view)."""
        return self._tok.metadata

    @property
    def input_ids(self) -> np.ndarray:
        """Tokens currently in the KV cache, int32."""
        return np.asarray(self._input_ids, dtype=np.int32)

    @property
    def n_tokens(self) -> int:
        return len(self._input_ids)

    # ---- tokens ---------------------------------------------------------------

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> List[int]:
        """Token ids of UTF-8 ``text`` (llama.cpp's tokenizer)."""
        return self._tok.tokenize(text, add_bos=add_bos, special=special)

    def detokenize(self, tokens: Sequence[int], prev_tokens: Optional[Sequence[int]] = None,
                   special: bool = False) -> bytes:
        """UTF-8 bytes of ``tokens``."""
        return self._tok.detokenize(tokens, prev_tokens=prev_tokens, special=special)

    def _piece(self, token: int) -> bytes:
        """Bytes of one generated token (cached: pieces concatenate for every vocab type)."""
        piece = self._pieces.get(token)
        if piece is None:
            piece = self._pieces[token] = self.detokenize([token])
        return piece

    def _is_eog(self, token: int) -> bool:
        """End-of-generation token (EOS, EOT, <|endoftext|>, ...), as llama.cpp decides (cached)."""
        eog = self._eog.get(token)
        if eog is None:
            eog = self._eog[token] = self._tok.is_eog(token)
        return eog

    # ---- evaluation -------------------------------------------------------------

    def set_seed(self, seed: int) -> None:
        """Seed the sampler (0xFFFFFFFF = random)."""
        self._seed = seed
        random = seed is None or seed < 0 or seed == LLAMA_DEFAULT_SEED  # -1 is "random" in llama.cpp too
        self._rng = np.random.default_rng(None if random else seed)

    def reset(self) -> None:
        """Forget all tokens (the KV cache is reused from position 0)."""
        self._input_ids = []
        self._last_logits = None
        self._backend.truncate(0)

    def eval(self, tokens: Sequence[int]) -> None:
        """Append ``tokens`` to the sequence and compute their logits.

        Raises:
            ValueError: the sequence would exceed n_ctx, or a token id is out of range.
        """
        tokens = list(tokens)
        if not tokens:
            return
        if len(self._input_ids) + len(tokens) > self.n_ctx():
            raise ValueError(f"Requested tokens ({len(self._input_ids) + len(tokens)}) exceed context window "
                             f"of {self.n_ctx()}")
        if self._backend.n_past != len(self._input_ids):  # e.g. a chunk of a failed eval got cached
            self._backend.truncate(len(self._input_ids))
        logits = self._backend.eval(tokens, logits_all=self._logits_all)
        self._input_ids.extend(tokens)
        # without logits_all this is a view of the native last-token buffer (no copy per token)
        self._last_logits = logits[-1] if not self._logits_all else logits[-1].copy()

    @property
    def scores(self) -> Optional[np.ndarray]:
        """Logits of the last evaluated token, float32 (n_vocab,): a copy, so it stays
        valid after later evals and after close()."""
        return None if self._last_logits is None else self._last_logits.copy()

    def sample(self, top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05, typical_p: float = 1.0,
               temp: float = 0.80, repeat_penalty: float = 1.0, **_unused) -> int:
        """Sample a token id from the last logits (temp <= 0 = greedy). Parameters in
        llama_cpp.Llama.sample's order; ``typical_p`` is accepted and not applied yet."""
        if self._last_logits is None:
            raise RuntimeError("sample() before eval(): no logits yet")
        params = SamplingParams(temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p,
                                repeat_penalty=repeat_penalty)
        return sample_token(self._last_logits, params, self._rng, self._input_ids)

    def generate(self, tokens: Sequence[int], top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05,
                 typical_p: float = 1.0, temp: float = 0.80, repeat_penalty: float = 1.0, reset: bool = True,
                 **_unused) -> Iterator[int]:
        """Yield sampled tokens after ``tokens``, endlessly (the caller stops).
        Parameters in llama_cpp.Llama.generate's order (``typical_p`` not applied yet).

        With ``reset`` the KV cache of the longest common prefix with the previous
        sequence is kept and only the rest is evaluated (prompt reuse).
        """
        tokens = list(tokens)
        if not tokens:
            raise ValueError("generate: tokens must not be empty")
        if reset and self._input_ids:
            n = 0
            for a, b in zip(self._input_ids, tokens):
                if a != b:
                    break
                n += 1
            n = min(n, len(tokens) - 1)  # re-evaluate at least one token for fresh logits
            self._input_ids = self._input_ids[:n]
            self._backend.truncate(n)
            tokens = tokens[n:]
        while True:
            self.eval(tokens)
            token = self.sample(temp=temp, top_k=top_k, top_p=top_p, min_p=min_p, repeat_penalty=repeat_penalty)
            tokens = yield token
            tokens = [token] if tokens is None else list(tokens)

    # ---- completion ---------------------------------------------------------------

    def create_completion(self, prompt: Union[str, List[int]], suffix: Optional[str] = None,
                          max_tokens: Optional[int] = 16, temperature: float = 0.8, top_p: float = 0.95,
                          min_p: float = 0.05, typical_p: float = 1.0, logprobs: Optional[int] = None,
                          echo: bool = False, stop: Optional[Union[str, List[str]]] = None,
                          frequency_penalty: float = 0.0, presence_penalty: float = 0.0,
                          repeat_penalty: float = 1.0, top_k: int = 40, stream: bool = False,
                          seed: Optional[int] = None, model: Optional[str] = None, stopping_criteria=None,
                          **_unused):
        """Complete ``prompt``; returns llama-cpp-python's completion dict, or an
        iterator of its stream chunks when ``stream``.

        Raises:
            ValueError: prompt longer than the context window
                ("Requested tokens (N) exceed context window of M").
        """
        if logprobs is not None:
            if not self._logits_all:
                raise ValueError("logprobs is not supported for models created with logits_all=False")
            raise NotImplementedError("logprobs is not implemented yet (the Llama API issue)")
        if not math.isfinite(temperature):
            raise ValueError(f"temperature must be a finite number, got {temperature}")
        ignored = {k: v for k, v in (("frequency_penalty", frequency_penalty), ("presence_penalty", presence_penalty),
                                     ("typical_p", typical_p - 1.0)) if v}
        ignored.update({k: v for k, v in _unused.items() if k in ("grammar", "mirostat_mode", "logit_bias",
                                                                   "logits_processor") and v})
        if ignored:
            warnings.warn(f"not applied yet by this sampler (the Llama API issue): {', '.join(sorted(ignored))}",
                          stacklevel=2)
        gen = self._completion(prompt, suffix, max_tokens, temperature, top_p, min_p, echo, stop,
                               repeat_penalty, top_k, stream, seed, model, stopping_criteria)
        if stream:
            return gen
        return next(gen)

    __call__ = create_completion

    def _prompt_tokens(self, prompt: Union[str, List[int]]) -> List[int]:
        if isinstance(prompt, (bytes, bytearray)) or not isinstance(prompt, (str, list, tuple, np.ndarray)):
            raise TypeError(f"prompt must be a str or a list of token ids, got {type(prompt).__name__}")
        if len(prompt) == 0:  # "" or []: start from BOS (an empty sequence has no logits to sample from)
            return [self.token_bos()]
        if isinstance(prompt, str):
            return self.tokenize(prompt.encode("utf-8"), special=True)
        return list(prompt)

    def _completion(self, prompt, suffix, max_tokens, temperature, top_p, min_p, echo, stop, repeat_penalty,
                    top_k, stream, seed, model, stopping_criteria):
        cid = f"cmpl-{uuid.uuid4()}"
        created = int(time.time())
        model_name = model if model is not None else self.model_path
        prompt_tokens = self._prompt_tokens(prompt)
        n_ctx = self.n_ctx()
        if len(prompt_tokens) >= n_ctx:
            raise ValueError(f"Requested tokens ({len(prompt_tokens)}) exceed context window of {n_ctx}")
        if max_tokens is None or max_tokens <= 0:
            max_tokens = n_ctx - len(prompt_tokens)
        max_tokens = min(max_tokens, n_ctx - len(prompt_tokens))
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        stop_bytes = [s.encode("utf-8") for s in stops if s]
        if seed is not None:
            self.set_seed(seed)
        prompt_text = ""
        if echo:  # the prompt as given (llama-cpp-python); token prompts are detokenized
            prompt_text = prompt if isinstance(prompt, str) else \
                self.detokenize(prompt_tokens, special=True).decode("utf-8", errors="ignore")

        def chunk(text, finish):
            return {"id": cid, "object": "text_completion", "created": created, "model": model_name,
                    "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish}]}

        if stream and echo and prompt_text:
            yield chunk(prompt_text, None)
        out: List[int] = []
        data = b""
        sent = 0
        finish = "length"
        if max_tokens > 0:
            for token in self.generate(prompt_tokens, top_k=top_k, top_p=top_p, min_p=min_p, temp=temperature,
                                       repeat_penalty=repeat_penalty):
                if self._is_eog(token):
                    finish = "stop"
                    break
                out.append(token)
                tail_from = max(0, len(data) - max((len(s) for s in stop_bytes), default=0) + 1)
                data += self._piece(token)
                hits = [h for h in (data.find(s, tail_from) for s in stop_bytes) if h >= 0]
                if hits:
                    data = data[:min(hits)]
                    finish = "stop"
                    break
                if stopping_criteria is not None and stopping_criteria(self.input_ids, self.scores):
                    finish = "stop"
                    break
                if stream:
                    end = _utf8_complete_end(data, len(data) - _stop_hold(data, stop_bytes))
                    if end > sent:
                        yield chunk(data[sent:end].decode("utf-8", errors="ignore"), None)
                        sent = end
                if len(out) >= max_tokens:
                    break
            # the sampled token that ended generation is not evaluated: drop nothing, cache stays valid
        text = data.decode("utf-8", errors="ignore")
        if stream:
            rest = data[sent:].decode("utf-8", errors="ignore")
            if rest:
                yield chunk(rest, None)
            yield chunk("", finish)
            return
        if echo:
            text = prompt_text + text
        if suffix is not None:
            text = text + suffix
        result = chunk(text, finish)
        result["usage"] = {"prompt_tokens": len(prompt_tokens), "completion_tokens": len(out),
                           "total_tokens": len(prompt_tokens) + len(out)}
        yield result

    # ---- lifetime -------------------------------------------------------------------

    def close(self) -> None:
        """Free the native model, context and tokenizer."""
        self._last_logits = None  # a view of the native context's buffer
        for part in ("_backend", "_tok"):
            obj = getattr(self, part, None)
            if obj is not None and obj is not _CLOSED:
                setattr(self, part, _CLOSED)
                obj.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
