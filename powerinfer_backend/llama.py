"""``Llama``: the llama-cpp-python-compatible high-level class over a backend.

Design (docs/architecture.md, docs/api.md): an own class, not a subclass of
``llama_cpp.Llama`` (whose ``__init__`` builds a full llama.cpp context). It computes
logits with a backend plugin (the native engine, ``"hybrid"``) and reuses llama-cpp-python
for everything above the logits, by calling its code rather than re-writing it:

* tokenizer, chat templates, ``_model`` (vocab, special tokens): a vocab-only
  ``llama_cpp.Llama`` (powerinfer_backend.text.tokenizer);
* sampling: llama.cpp's sampler chain, built by ``llama_cpp.Llama._init_sampler`` and
  applied to our logits (powerinfer_backend.text.sampling);
* completion (stop strings, streaming, echo, logprobs, suffix, logit_bias, the prompt
  cache), chat completion (GGUF template, named chat formats, tools, response_format) and
  ``from_pretrained``: llama-cpp-python's own methods, called with this object as ``self``.
  They use only the attributes this class provides (``tokenize``, ``detokenize``,
  ``generate``, ``_scores``, ``_model``, ...), so their behaviour is llama-cpp-python's.
"""

from __future__ import annotations

import math
import os
import re
import sys
import time
import warnings
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

import numpy as np

import llama_cpp
from llama_cpp.llama import Llama as _LlamaCpp
from llama_cpp.llama import LlamaState

from .plugins.manager import plugin_manager, select_backend
from .llama_options import backend_options, check_options
from .text.perf import PerfContext
from .text.pooling import pool
from .text.sampling import ChainSampler, TokenDataBuffer
from .text.tokenizer import LlamaCppTokenizer

LLAMA_DEFAULT_SEED = llama_cpp.LLAMA_DEFAULT_SEED  # 0xFFFFFFFF: llama.cpp's "pick a random seed"

_STATE_MAGIC = b"powerinfer_backend/replay-v1"


class _ClosedPart:
    """Stands in for the backend and tokenizer after :meth:`Llama.close`: any use
    raises a clear error instead of an AttributeError on None (or a use-after-free)."""

    def __getattr__(self, name):
        raise RuntimeError(_CLOSED_MESSAGE)


_CLOSED_MESSAGE = "Llama: the model is closed (close() was called or its `with` block ended)"
_CLOSED = _ClosedPart()


class Llama:
    """Load a GGUF model and generate text, with llama-cpp-python's API.

    Args:
        model_path: path of a GGUF file.
        n_ctx: context length in tokens (0 = the model's training context).
        n_batch: most prompt tokens per native call (capped at n_ctx, as llama-cpp-python).
        n_threads: compute threads (None or <= 0 = the physical cores available to this
            process, as llama.cpp; ``engine.default_threads()``, docs/architecture.md).
        seed: sampling seed (0xFFFFFFFF = random, as llama.cpp).
        vram_budget: device memory for dense blocks and hot neurons: GiB as a number or
            a size string ("512MiB", "8GiB"); None = from ``n_gpu_layers`` if given, else
            the device's free memory minus a margin; above it: ``ValueError`` with both
            byte counts (docs/placement.md). Without a device: ignored with a warning.
        device (keyword): "auto" (default: the first discrete GPU ggml reports, else CPU
            only, said once), "cuda" / "metal" / "vulkan" / "hip" (the first device of
            that backend: a GPU build of llama-cpp-python, docs/building.md), a ggml
            device name ("CUDA0"; ``powerinfer-backend devices``), "ggml-cpu" (ggml's CPU
            backend as the device; alias "cpu-device") or "cpu" (none). Unknown name:
            ``ValueError`` listing ggml's devices; ggml missing / wrong version: ``RuntimeError``.
        placement (keyword): "auto" (default: the fastest predicted decode of the
            throughput planner, the neuron plan and the layer split; ``stats()["device"]
            ["placement"]`` says which won and its predicted ratio to llama.cpp's layer
            split, docs/placement.md), "neurons" (dense blocks, then hot neurons) or
            "layers" (whole layers, as llama.cpp's -ngl). device_bandwidth (keyword): the
            device's memory bandwidth in GB/s for "auto" (default: a table of common GPUs
            by ggml's device description; ggml-cpu shares the host's memory, so "auto" runs
            the neuron plan there unless this is given).
            n_gpu_layers, reset_gpu_index,
            disable_gpu_index, device_threads (keywords): N whole layers' bytes (0 CPU,
            -1 all) without ``vram_budget``; PowerInfer's flags; "ggml-cpu" threads.
        logits_all: keep logits for every position (needed by ``logprobs``).
        embedding: allow ``embed`` / ``create_embedding``.
        last_n_tokens_size: window of the repeat / frequency / presence penalties.
        chat_format, chat_handler: as llama-cpp-python (default: guessed from the GGUF
            chat template).
        verbose: print load information to stderr.
        sparse: sparse FFN mode: "auto" (the calibration sidecar unless it measured slower
            than dense, exact zeros for ReLU models, else dense), "off", "threshold", "predictor", or
            a sidecar path (:mod:`powerinfer_backend.sparsity.modes`).
        backend: name of a registered backend plugin; ``"auto"`` (default) = the native
            engine (``"hybrid"``), or ``"llama_cpp"`` (not accelerated, says so once) for
            an architecture the native engine does not run.
        **kwargs: any other ``llama_cpp.Llama`` parameter; GPU-layer ones are ignored
            with one warning, ones that would change results and are not implemented
            warn when set, unknown ones are tolerated.

    Raises:
        ValueError: missing or malformed model file, bad parameter.
    """

    def __init__(self, model_path: str, *, n_ctx: int = 512, n_batch: int = 512, n_threads: Optional[int] = None,
                 seed: int = LLAMA_DEFAULT_SEED, vram_budget: Optional[float] = None, sparse: Any = "auto",
                 logits_all: bool = False, embedding: bool = False, last_n_tokens_size: int = 64,
                 chat_format: Optional[str] = None, chat_handler=None, spm_infill: bool = False,
                 rope_freq_base: float = 0.0, rope_freq_scale: float = 0.0, verbose: bool = True,
                 backend: str = "auto", **kwargs):
        t_load = time.perf_counter()
        if not os.path.exists(model_path):
            raise ValueError(f"Model path does not exist: {model_path}")
        if n_ctx is None or n_ctx < 0:
            raise ValueError(f"n_ctx must be >= 0 (0 = the model's training context), got {n_ctx}")
        if n_batch < 1:
            raise ValueError(f"n_batch must be >= 1, got {n_batch}")
        n_threads = n_threads if n_threads is None or n_threads >= 1 else None  # -1 / 0: the default
        check_options(vram_budget, rope_freq_base, rope_freq_scale, kwargs)
        # what __getstate__ hands to __init__ again (pickling, as llama-cpp-python)
        self._init_kwargs = dict(n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads, seed=seed,
                                 vram_budget=vram_budget, sparse=sparse, logits_all=logits_all, embedding=embedding,
                                 last_n_tokens_size=last_n_tokens_size, chat_format=chat_format,
                                 chat_handler=chat_handler, spm_infill=spm_infill, rope_freq_base=rope_freq_base,
                                 rope_freq_scale=rope_freq_scale, verbose=verbose, backend=backend, **kwargs)
        self.model_path = model_path
        self.verbose = verbose
        self.vram_budget = vram_budget
        self.sparse = sparse
        self._logits_all = bool(logits_all)
        self._embedding = bool(embedding)
        self.last_n_tokens_size = int(last_n_tokens_size)
        self.spm_infill = spm_infill
        self.cache = None
        self.draft_model = None
        # the backend first: it validates the GGUF with messages naming the file and tensor
        options = backend_options(n_ctx=n_ctx, n_batch=min(n_batch, n_ctx or n_batch), n_threads=n_threads,
                                  vram_budget=vram_budget, verbose=verbose, sparse=sparse, kwargs=kwargs)
        self.backend, self._backend = select_backend(backend, model_path, options)
        for notice in getattr(self._backend, "notices", ()):
            warnings.warn(notice, UserWarning, stacklevel=2)  # at the caller's line
        self._n_ctx = int(getattr(self._backend, "n_ctx_seq", self._backend.n_ctx))  # sequence 0's window
        self._tok = LlamaCppTokenizer(model_path, n_ctx=self._n_ctx, chat_format=chat_format)
        self.n_batch = min(n_batch, self._n_ctx)  # as llama_cpp.Llama exposes it
        self.n_threads = getattr(self._backend, "n_threads", n_threads)
        self._n_vocab = int(self._backend.n_vocab)
        self._token_nl = self._tok.token_nl
        self._token_eos = self._tok.token_eos
        vocab_llama = self._tok.llama
        self._model = vocab_llama._model  # LlamaModel (vocab only): special tokens, vocab for EOG / grammar
        self.tokenizer_ = vocab_llama.tokenizer_
        self.chat_format = vocab_llama.chat_format  # chat_format as given, else guessed from the GGUF
        self.chat_handler = chat_handler
        self._chat_handlers = dict(vocab_llama._chat_handlers)  # from the GGUF's chat templates
        # llama-cpp-python's completion code resets / prints these when verbose
        self._ctx = PerfContext()
        self.n_tokens = 0
        self.input_ids = np.zeros(self._n_ctx, dtype=np.intc)
        # logits of every position (logits_all) or of the last evaluated token
        self.scores = np.zeros((self._n_ctx if self._logits_all else 1, self._n_vocab), dtype=np.single)
        self._last_logits: Optional[np.ndarray] = None  # without logits_all: a view of the native buffer
        self._requires_eval = True  # restored or truncated state must decode before sampling
        self._token_data = TokenDataBuffer(self._n_vocab)
        self._sampler: Optional[ChainSampler] = None
        self._eog: dict = {}
        self.set_seed(seed)
        plugin_manager().hook.powerinfer_backend_model_loaded(llama=self, backend_name=self.backend)
        self._announced = True
        self._ctx.load_s = time.perf_counter() - t_load

    def stats(self, reset: bool = False) -> dict:
        """Measured FFN sparsity since load (or the last ``reset``): ``{"mode",
        "ffn_sparsity", "layers", ...}`` (:func:`powerinfer_backend.sparsity.modes.stats`);
        ``{}`` for a backend without statistics."""
        fn = getattr(self._backend, "stats", None)
        return {} if fn is None else fn(reset=True) if reset else fn()  # third-party ones may take no argument

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

    def tokenizer(self):
        """llama-cpp-python's ``LlamaTokenizer`` for this vocabulary."""
        return self.tokenizer_

    def pooling_type(self) -> int:
        """llama.cpp's pooling type of the model (``{arch}.pooling_type``; NONE when absent)."""
        arch = self.metadata.get("general.architecture", "")
        return int(self.metadata.get(f"{arch}.pooling_type", llama_cpp.LLAMA_POOLING_TYPE_NONE))

    @property
    def metadata(self) -> dict:
        """GGUF metadata as ``{key: str}`` (llama.cpp's view)."""
        return self._tok.metadata

    @property
    def engine(self):
        """The backend object this Llama runs on (its name is :attr:`backend`), as its plugin's factory made it."""
        return self._backend

    native_context = property(lambda self: getattr(self._backend, "native_context", None), doc="""The engine's
        NativeContext (None without one): ``Llama(n_seq_max=N)``'s eval_seqs for the server; Llama uses sequence 0.""")

    @property
    def ctx(self):
        """The vocab-only llama.cpp context (no weights, no KV cache); it reports n_ctx."""
        return self._tok.llama.ctx

    @property
    def model(self):
        return self._model.model

    @property
    def _input_ids(self) -> np.ndarray:
        """Tokens currently in the KV cache (a view of ``input_ids``)."""
        return self.input_ids[: self.n_tokens]

    @_input_ids.setter
    def _input_ids(self, tokens) -> None:
        tokens = list(tokens)
        self.input_ids[: len(tokens)] = tokens
        self.n_tokens = len(tokens)

    @property
    def _scores(self) -> np.ndarray:
        """Logits rows: every cached position with logits_all, else the last one (1 row)."""
        if self._logits_all:
            return self.scores[: self.n_tokens, :]
        if self._last_logits is None:
            return self.scores[:0]
        return self._last_logits[None, :]

    # ---- tokens ---------------------------------------------------------------

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> List[int]:
        """Token ids of UTF-8 ``text`` (llama.cpp's tokenizer)."""
        return self._tok.tokenize(text, add_bos=add_bos, special=special)

    def detokenize(self, tokens: Sequence[int], prev_tokens: Optional[Sequence[int]] = None,
                   special: bool = False) -> bytes:
        """UTF-8 bytes of ``tokens``.

        Raises:
            ValueError: a token id outside [0, n_vocab) (llama.cpp would abort the process).
        """
        n_vocab = self._n_vocab
        for seq in (tokens, prev_tokens or ()):
            bad = [t for t in seq if not 0 <= int(t) < n_vocab]
            if bad:
                raise ValueError(f"token id {bad[0]} is outside the vocabulary [0, {n_vocab})")
        return self._tok.detokenize(tokens, prev_tokens=prev_tokens, special=special)

    def _is_eog(self, token: int) -> bool:
        """End-of-generation token (EOS, EOT, <|endoftext|>, ...), as llama.cpp decides (cached)."""
        eog = self._eog.get(token)
        if eog is None:
            eog = self._eog[token] = self._tok.is_eog(token)
        return eog

    # ---- evaluation -------------------------------------------------------------

    def set_cache(self, cache) -> None:
        """Use a llama-cpp-python prompt cache (``LlamaRAMCache`` / ``LlamaDiskCache``)."""
        self.cache = cache

    def set_seed(self, seed: int) -> None:
        """Seed for the next sampler chain (0xFFFFFFFF = random)."""
        self._seed = seed

    def reset(self) -> None:
        """Forget all tokens (the KV cache is reused from position 0)."""
        self._check_open()
        self.n_tokens = 0
        self._requires_eval = True

    def eval(self, tokens: Sequence[int]) -> None:
        """Append ``tokens`` to the sequence and compute their logits.

        Raises:
            ValueError: the sequence would exceed n_ctx, or a token id is out of range.
        """
        tokens = list(tokens)
        if not tokens:
            return
        n_past = self.n_tokens
        if n_past + len(tokens) > self._n_ctx:
            raise ValueError(f"Requested tokens ({n_past + len(tokens)}) exceed context window of {self._n_ctx}")
        be = self._backend
        if be.n_past != n_past:  # reset() / truncation, or a chunk of a failed eval got cached
            be.truncate(n_past)
        t0 = time.perf_counter()
        logits = be.eval(tokens, logits_all=self._logits_all)
        self._ctx.record(len(tokens), time.perf_counter() - t0)
        self.input_ids[n_past: n_past + len(tokens)] = tokens
        if self._logits_all:
            self.scores[n_past: n_past + len(tokens), :] = logits
            self._last_logits = self.scores[n_past + len(tokens) - 1]
        else:
            # a view of the native last-token buffer (no copy per token)
            self._last_logits = logits[-1]
        self.n_tokens = n_past + len(tokens)
        self._requires_eval = False

    def _init_sampler(self, **params) -> ChainSampler:
        """llama.cpp's sampler chain exactly as llama-cpp-python builds it, over our logits."""
        chain = _LlamaCpp._init_sampler(self, **params)
        g = params.get
        argmax_exact = (g("temp", 0.8) == 0.0 and g("logits_processor") is None and g("grammar") is None
                        and g("repeat_penalty", 1.0) == 1.0 and g("frequency_penalty", 0.0) == 0.0
                        and g("presence_penalty", 0.0) == 0.0)
        return ChainSampler(chain, self._token_data, argmax_exact=argmax_exact)

    def sample(self, top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05, typical_p: float = 1.0,
               temp: float = 0.80, repeat_penalty: float = 1.0, frequency_penalty: float = 0.0,
               presence_penalty: float = 0.0, tfs_z: float = 1.0, mirostat_mode: int = 0,
               mirostat_eta: float = 0.1, mirostat_tau: float = 5.0, penalize_nl: bool = True,
               logits_processor=None, grammar=None, idx: Optional[int] = None) -> int:
        """Sample a token id from the logits at position ``idx`` (default: the last),
        with llama.cpp's sampler chain (the one of the running ``generate``, else a new
        one seeded with the current seed, as llama-cpp-python)."""
        if self.n_tokens == 0 or self._last_logits is None:
            raise RuntimeError("sample() before eval(): no logits yet")
        sampler = self._sampler
        tmp = sampler is None
        if tmp:
            sampler = self._init_sampler(top_k=top_k, top_p=top_p, min_p=min_p, typical_p=typical_p, temp=temp,
                                         repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty,
                                         presence_penalty=presence_penalty, tfs_z=tfs_z, mirostat_mode=mirostat_mode,
                                         mirostat_tau=mirostat_tau, mirostat_eta=mirostat_eta,
                                         penalize_nl=penalize_nl, logits_processor=logits_processor, grammar=grammar)
        if idx is None or idx == self.n_tokens - 1:
            logits = self._last_logits
        elif self._logits_all and 0 <= idx < self.n_tokens:
            logits = self.scores[idx]
        else:
            raise ValueError(f"sample: no logits kept for position {idx} (logits_all=False keeps the last only)")
        try:
            return sampler.sample(logits)
        finally:
            if tmp:
                sampler.close()

    def generate(self, tokens: Sequence[int], top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05,
                 typical_p: float = 1.0, temp: float = 0.80, repeat_penalty: float = 1.0, reset: bool = True,
                 frequency_penalty: float = 0.0, presence_penalty: float = 0.0, tfs_z: float = 1.0,
                 mirostat_mode: int = 0, mirostat_tau: float = 5.0, mirostat_eta: float = 0.1,
                 penalize_nl: bool = True, logits_processor=None, stopping_criteria=None,
                 grammar=None) -> Iterator[int]:
        """Yield sampled tokens after ``tokens``, endlessly (the caller stops); send a
        list of tokens to the generator to append them after the yielded one.

        With ``reset`` the KV cache of the longest common prefix with the previous
        sequence is kept and only the rest is evaluated (prompt reuse), as
        llama-cpp-python's ``generate``.
        """
        params = dict(top_k=top_k, top_p=top_p, min_p=min_p, typical_p=typical_p, temp=temp,
                      repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty,
                      presence_penalty=presence_penalty, tfs_z=tfs_z, mirostat_mode=mirostat_mode,
                      mirostat_tau=mirostat_tau, mirostat_eta=mirostat_eta, penalize_nl=penalize_nl,
                      logits_processor=logits_processor, grammar=grammar)
        if self._sampler is not None:
            self._sampler.close()
        self._sampler = self._init_sampler(**params)
        tokens = list(tokens)
        if reset and self.n_tokens > 0:
            prefix = _LlamaCpp.longest_token_prefix(self._input_ids.tolist(), tokens)
            consumed = prefix == len(tokens)
            if consumed and self.n_tokens == len(tokens) and not self._requires_eval:
                reset, tokens = False, []  # the whole prompt is cached with live logits
            else:
                keep = prefix - 1 if consumed else prefix  # re-evaluate one token for fresh logits
                if keep > 0:
                    reset, tokens = False, tokens[keep:]
                    self.n_tokens = keep
                    self._requires_eval = True
                    if self.verbose:
                        print(f"Llama.generate: {keep} prefix-match hit, remaining {len(tokens)} prompt tokens "
                              f"to eval", file=sys.stderr)
        if reset:
            self.reset()
        if not tokens and self.n_tokens == 0:
            raise RuntimeError("generate: empty prompt and nothing cached: no logits to sample from")
        sample_idx = self.n_tokens + len(tokens) - 1
        sampler = self._sampler
        while True:
            self.eval(tokens)
            while sample_idx < self.n_tokens:
                if sample_idx == self.n_tokens - 1 and self._sampler is sampler:  # the usual case, direct
                    token = sampler.sample(self._last_logits)
                else:
                    token = self.sample(idx=sample_idx, **params)
                sample_idx += 1
                if stopping_criteria is not None and stopping_criteria(self._input_ids[:sample_idx],
                                                                       self._scores[-1, :]):
                    return
                sent = yield token
                tokens = [token] if sent is None else [token, *sent]
                if sample_idx < self.n_tokens and token != self.input_ids[sample_idx]:
                    self.n_tokens = sample_idx
                    self._requires_eval = True
                    break

    # ---- completion, chat, embeddings: llama-cpp-python's own code ----------------------------

    def create_completion(self, prompt: Union[str, List[int]], suffix: Optional[str] = None,
                          max_tokens: Optional[int] = 16, temperature: float = 0.8, top_p: float = 0.95,
                          min_p: float = 0.05, typical_p: float = 1.0, logprobs: Optional[int] = None,
                          echo: bool = False, stop: Optional[Union[str, List[str]]] = [],
                          frequency_penalty: float = 0.0, presence_penalty: float = 0.0,
                          repeat_penalty: float = 1.0, top_k: int = 40, stream: bool = False,
                          seed: Optional[int] = None, tfs_z: float = 1.0, mirostat_mode: int = 0,
                          mirostat_tau: float = 5.0, mirostat_eta: float = 0.1, model: Optional[str] = None,
                          stopping_criteria=None, logits_processor=None, grammar=None,
                          logit_bias: Optional[Dict[int, float]] = None):
        """Complete ``prompt``: llama-cpp-python's ``create_completion`` (its result dict,
        or an iterator of its stream chunks when ``stream``), running on this model.

        Raises:
            ValueError: prompt longer than the context window
                ("Requested tokens (N) exceed context window of M"); logprobs without
                logits_all.
            TypeError: a prompt that is neither a str nor a list of token ids.
        """
        if isinstance(prompt, np.ndarray):
            prompt = prompt.tolist()
        elif isinstance(prompt, tuple):
            prompt = list(prompt)
        if not isinstance(prompt, (str, list)):
            raise TypeError(f"prompt must be a str or a list of token ids, got {type(prompt).__name__}")
        if not math.isfinite(temperature):  # llama.cpp's chain would sample from NaN logits
            raise ValueError(f"temperature must be a finite number, got {temperature}")
        return _LlamaCpp.create_completion(
            self, prompt, suffix=suffix, max_tokens=max_tokens, temperature=temperature, top_p=top_p, min_p=min_p,
            typical_p=typical_p, logprobs=logprobs, echo=echo, stop=stop, frequency_penalty=frequency_penalty,
            presence_penalty=presence_penalty, repeat_penalty=repeat_penalty, top_k=top_k, stream=stream,
            seed=seed, tfs_z=tfs_z, mirostat_mode=mirostat_mode, mirostat_tau=mirostat_tau,
            mirostat_eta=mirostat_eta, model=model, stopping_criteria=stopping_criteria,
            logits_processor=logits_processor, grammar=grammar, logit_bias=logit_bias)

    def _create_completion(self, *args, **kwargs):
        try:
            yield from _LlamaCpp._create_completion(self, *args, **kwargs)
        except ValueError as e:
            # llama-cpp-python names llama_n_ctx(self.ctx), the vocab-only context that
            # llama.cpp rounds up to >= 256 tokens; the limit it checked is our n_ctx
            msg = re.sub(r"(exceed context window of )\d+", rf"\g<1>{self._n_ctx}", str(e))
            if msg == str(e):
                raise
            raise ValueError(msg) from None

    __call__ = create_completion

    def create_chat_completion(self, messages, **kwargs):
        """llama-cpp-python's ``create_chat_completion``: the chat handler of
        ``chat_handler`` / ``chat_format`` / the GGUF template formats ``messages`` and
        calls ``create_completion`` (tools, tool_choice, response_format, streaming)."""
        return _LlamaCpp.create_chat_completion(self, messages, **kwargs)

    def create_chat_completion_openai_v1(self, *args, **kwargs):
        """``create_chat_completion`` as ``openai`` types (needs the openai package)."""
        return _LlamaCpp.create_chat_completion_openai_v1(self, *args, **kwargs)

    from_pretrained = classmethod(_LlamaCpp.from_pretrained.__func__)

    logits_to_logprobs = staticmethod(_LlamaCpp.logits_to_logprobs)
    longest_token_prefix = staticmethod(_LlamaCpp.longest_token_prefix)

    def create_embedding(self, input: Union[str, List[str]], model: Optional[str] = None):
        """llama-cpp-python's ``create_embedding`` over :meth:`embed`."""
        return _LlamaCpp.create_embedding(self, input, model=model)

    def embed(self, input: Union[str, List[str]], normalize: bool = False, truncate: bool = True,
              return_count: bool = False):
        """Embeddings of each input, as llama-cpp-python: per token (pooling NONE, this
        architecture's default) or pooled (MEAN / CLS / LAST by the model's pooling type).

        Raises:
            RuntimeError: the model was not created with embedding=True.
            ValueError: an input longer than n_batch with truncate=False.
        """
        if not self._embedding:
            raise RuntimeError("Llama model must be created with embedding=True to call this method")
        inputs = [input] if isinstance(input, str) else list(input)
        pooling = self.pooling_type()
        data, total = [], 0
        self.reset()
        for text in inputs:
            tokens = self.tokenize(text.encode("utf-8"))
            if truncate:
                tokens = tokens[: self.n_batch]
            if len(tokens) > self.n_batch:
                raise ValueError(f"Requested tokens ({len(tokens)}) exceed batch size of {self.n_batch}")
            total += len(tokens)
            self._backend.truncate(0)
            self._backend.eval(tokens, logits_all=True)
            data.append(pool(self._backend.embeddings(), pooling, normalize))
        self._backend.truncate(0)
        self.reset()
        out = data[0] if isinstance(input, str) else data
        return (out, total) if return_count else out

    # ---- state ------------------------------------------------------------------------

    def save_state(self) -> "LlamaState":
        """The sequence, its logits and the seed (llama-cpp-python's ``LlamaState``). The
        KV cache is not copied: the engine is deterministic, so :meth:`load_state`
        re-evaluates what the current cache does not share with the saved tokens.

        Raises:
            RuntimeError: the model is closed.
        """
        self._check_open()
        return LlamaState(input_ids=self.input_ids.copy(), scores=self._scores.copy(), n_tokens=self.n_tokens,
                          llama_state=_STATE_MAGIC, llama_state_size=len(_STATE_MAGIC), seed=self._seed)

    def load_state(self, state: "LlamaState") -> None:
        """Restore a state from :meth:`save_state` (tokens, logits, seed, KV cache)."""
        if bytes(state.llama_state[: len(_STATE_MAGIC)]) != _STATE_MAGIC:
            raise ValueError("load_state: not a powerinfer_backend state (llama.cpp context states cannot be "
                             "loaded into this engine)")
        n = int(state.n_tokens)
        if n > self._n_ctx:
            raise ValueError(f"Requested tokens ({n}) exceed context window of {self._n_ctx}")
        tokens = np.asarray(state.input_ids[:n], dtype=np.intc)
        be = self._backend
        keep = min(_LlamaCpp.longest_token_prefix(self.input_ids[: min(self.n_tokens, be.n_past)].tolist(),
                                                  tokens.tolist()), n)
        be.truncate(keep)
        if keep < n:
            be.eval(tokens[keep:].tolist(), logits_all=False)
        self.input_ids[:n] = tokens
        self.n_tokens = n
        scores = np.asarray(state.scores, dtype=np.single)
        if self._logits_all:
            self.scores[: len(scores)] = scores
            self._last_logits = self.scores[n - 1] if n else None
        else:
            self._last_logits = scores[-1].copy() if len(scores) else None
        self._seed = state.seed
        self._requires_eval = True

    # ---- lifetime -------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._backend is _CLOSED:
            raise RuntimeError(_CLOSED_MESSAGE)

    def close(self) -> None:
        """Free the native model, context, tokenizer and sampler."""
        if getattr(self, "_announced", False):
            self._announced = False
            plugin_manager().hook.powerinfer_backend_model_unloaded(llama=self)
        self._last_logits = None  # may be a view of the native context's buffer
        sampler, self._sampler = getattr(self, "_sampler", None), None
        if sampler is not None:
            sampler.close()
        for part in ("_backend", "_tok"):
            obj = getattr(self, part, None)
            if obj is not None and obj is not _CLOSED:
                setattr(self, part, _CLOSED)
                obj.close()
        if getattr(self, "_model", None) is not None:
            self._model = _CLOSED

    def __getstate__(self):
        """Pickle as the constructor arguments (the model is loaded again), with the
        current seed, as llama-cpp-python."""
        return dict(model_path=self.model_path, **{**self._init_kwargs, "seed": self._seed})

    def __setstate__(self, state):
        state = dict(state)
        self.__init__(state.pop("model_path"), **state)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
