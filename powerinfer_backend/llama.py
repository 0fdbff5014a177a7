"""``Llama``: the llama-cpp-python-compatible high-level class over a backend.

Design (docs/architecture.md, docs/api.md): an own class, not a subclass of
``llama_cpp.Llama`` (whose ``__init__`` builds a full llama.cpp context). A backend plugin
(the native engine, ``"hybrid"``) computes logits; everything above them is ours, built on
llama.cpp's leaf components through llama-cpp-python's public API and its low-level
``llama_cpp`` bindings:

* tokens: llama.cpp's tokenizer of a vocab-only ``llama_cpp.Llama``
  (powerinfer_backend.text.tokenizer);
* one :class:`~powerinfer_backend.text.sequence.Sequence` (tokens, KV cells, logits,
  sampler chain built from llama.cpp's samplers: text.sampling, text.grammar);
* completion: the runner's events (text.runner) rendered in llama-cpp-python's shapes
  (text.completion), with its stop, streaming, echo, logprobs, suffix, logit_bias and
  prompt-cache rules;
* chat: llama-cpp-python's public chat-format handlers (GGUF templates, named formats,
  tools, response_format), which call :meth:`Llama.create_completion` (text.chat).
"""

from __future__ import annotations

import math
import os
import time
import warnings
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

import numpy as np

import llama_cpp
from llama_cpp.llama import LlamaState

from .loader.hub import from_pretrained
from .plugins.manager import plugin_manager, select_backend
from .llama_options import backend_options, check_options, check_sizes
from .text import chat, runner
from .text.completion import Options, completion, prompt_tokens
from .text.detok import PieceText
from .text.logprobs import log_softmax
from .text.perf import PerfContext
from .text.pooling import pool
from .text.sampling import SamplingParams
from .text.sequence import Sequence as TokenSequence, common_prefix
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
            backend as the device) or "cpu" (none). Unknown name:
            ``ValueError`` listing ggml's devices; ggml missing / wrong version: ``RuntimeError``.
        placement (keyword): "auto" (default: the fastest predicted decode of the
            throughput planner, the neuron plan and the layer split; ``stats()["device"]
            ["placement"]`` says which won and its predicted ratio to llama.cpp's layer
            split, docs/placement.md), "neurons" (dense blocks, then hot neurons) or
            "layers" (whole layers, as llama.cpp's -ngl). device_bandwidth (keyword): the
            device's memory bandwidth in GB/s for "auto" (default: a table of common GPUs
            by ggml's device description; ggml-cpu shares the host's memory, so "auto" runs
            the neuron plan there unless this is given). device_skips (keyword): with
            predictors, a split layer's device computes only the hot neurons they select (True)
            or every hot neuron (False); default None: the cost model's choice with "auto",
            else True (docs/placement.md, "Predictors and gate thresholds with a device").
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
        repack (keyword): True (default) = the Q4_0 / Q5_0 / Q8_0 / Q4_K / Q5_K / Q6_K matrices of the
            dense products copied at load into row groups of 16 interleaved rows (as
            llama.cpp's repacked CPU weights; their file pages released: one copy in memory)
            when no device takes the model; False = the file's rows (llama.cpp's plain
            kernels' float order). Not a bool: ``ValueError``.
        backend: name of a registered backend plugin; ``"auto"`` (default) = the native
            engine (``"hybrid"``), or ``"llama_cpp"`` (not accelerated, says so once) for
            an architecture the native engine does not run.
        **kwargs: any other ``llama_cpp.Llama`` parameter; GPU-layer ones are ignored
            with one warning, ones that would change results and are not implemented
            warn when set, unknown ones are tolerated.

    Raises:
        ValueError: missing or malformed model file, bad parameter.
    """

    def __init__(
        self,
        model_path: str,
        *,
        n_ctx: int = 512,
        n_batch: int = 512,
        n_threads: Optional[int] = None,
        seed: int = LLAMA_DEFAULT_SEED,
        vram_budget: Optional[float] = None,
        sparse: Any = "auto",
        logits_all: bool = False,
        embedding: bool = False,
        last_n_tokens_size: int = 64,
        chat_format: Optional[str] = None,
        chat_handler=None,
        spm_infill: bool = False,
        rope_freq_base: float = 0.0,
        rope_freq_scale: float = 0.0,
        verbose: bool = True,
        backend: str = "auto",
        **kwargs,
    ):
        t_load = time.perf_counter()
        if not os.path.exists(model_path):
            raise ValueError(f"Model path does not exist: {model_path}")
        check_sizes(n_ctx, n_batch, n_threads)
        n_ctx, n_batch = int(n_ctx), int(n_batch)
        n_threads = n_threads if n_threads is None or n_threads >= 1 else None  # -1 / 0: the default
        check_options(vram_budget, rope_freq_base, rope_freq_scale, kwargs)
        # what __getstate__ hands to __init__ again (pickling, as llama-cpp-python)
        self._init_kwargs = dict(
            n_ctx=n_ctx,
            n_batch=n_batch,
            n_threads=n_threads,
            seed=seed,
            vram_budget=vram_budget,
            sparse=sparse,
            logits_all=logits_all,
            embedding=embedding,
            last_n_tokens_size=last_n_tokens_size,
            chat_format=chat_format,
            chat_handler=chat_handler,
            spm_infill=spm_infill,
            rope_freq_base=rope_freq_base,
            rope_freq_scale=rope_freq_scale,
            verbose=verbose,
            backend=backend,
            **kwargs,
        )
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
        options = backend_options(
            n_ctx=n_ctx,
            n_batch=min(n_batch, n_ctx or n_batch),
            n_threads=n_threads,
            vram_budget=vram_budget,
            verbose=verbose,
            sparse=sparse,
            kwargs=kwargs,
        )
        self.backend, self._backend = select_backend(backend, model_path, options)
        for notice in getattr(self._backend, "notices", ()):
            warnings.warn(notice, UserWarning, stacklevel=2)  # at the caller's line
        self._n_ctx = int(getattr(self._backend, "n_ctx_seq", self._backend.n_ctx))  # sequence 0's window
        self._tok = LlamaCppTokenizer(model_path, n_ctx=self._n_ctx, chat_format=chat_format)
        self.n_batch = min(n_batch, self._n_ctx)  # as llama_cpp.Llama exposes it
        self.n_threads = getattr(self._backend, "n_threads", n_threads)
        self._n_vocab = int(self._backend.n_vocab)
        vocab_llama = self._tok.llama
        self.tokenizer_ = vocab_llama.tokenizer_
        self.chat_format = vocab_llama.chat_format  # chat_format as given, else guessed from the GGUF
        self.chat_handler = chat_handler
        self.chat_handlers = chat.gguf_chat_handlers(self._tok.metadata, self._tok)  # the GGUF's chat templates
        if chat_format is not None and chat_handler is None:
            try:
                chat.check_chat_format(chat_format, self.chat_handlers)
            except ValueError:
                self.close()
                raise
        self.perf = PerfContext()  # llama.cpp's timing report, printed after a completion when verbose
        self._seq = self.new_sequence(self._backend, self._n_ctx)
        self.set_seed(seed)
        plugin_manager().hook.powerinfer_backend_model_loaded(llama=self, backend_name=self.backend)
        self._announced = True
        self.perf.load_s = time.perf_counter() - t_load

    def new_sequence(self, evaluator, n_ctx: int, seq_id: int = 0) -> TokenSequence:
        """A sequence of this model's vocabulary over ``evaluator`` (the backend or a server slot's view)."""
        return TokenSequence(
            evaluator,
            n_ctx=n_ctx,
            n_vocab=self._n_vocab,
            logits_all=self._logits_all,
            vocab=self._tok.vocab,
            seq_id=seq_id,
            penalty_last_n=self.last_n_tokens_size,
            perf=self.perf,
            verbose=self.verbose,
        )

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

    native_context = property(
        lambda self: getattr(self._backend, "native_context", None),
        doc="""The engine's
        NativeContext (None without one): ``Llama(n_seq_max=N)``'s eval_seqs for the server; Llama uses sequence 0.""",
    )

    @property
    def ctx(self):
        """The vocab-only llama.cpp context (no weights, no KV cache); it reports n_ctx."""
        return self._tok.llama.ctx

    @property
    def model(self):
        """The vocab-only ``llama_model_p`` (llama.cpp's vocabulary and metadata of the file)."""
        return self._tok.llama.model

    @property
    def vocab(self):
        """llama.cpp's vocabulary (``llama_vocab_p``) of the model, for low-level calls."""
        return self._tok.vocab

    @property
    def logits_all(self) -> bool:
        """Whether logits are kept for every position (``logits_all=True``; needed by ``logprobs``)."""
        return self._logits_all

    @property
    def sequence(self) -> TokenSequence:
        """The token sequence this model generates in (tokens, logits, sampler chain)."""
        return self._seq

    # llama-cpp-python's per-sequence attributes, kept by the sequence
    n_tokens = property(
        lambda self: self._seq.n_tokens,
        lambda self, n: setattr(self._seq, "n_tokens", n),
        doc="Tokens in the sequence (its KV cells).",
    )
    input_ids = property(lambda self: self._seq.input_ids, doc="int32 array of n_ctx token slots, n_tokens used.")
    scores = property(lambda self: self._seq.scores, doc="float32 logits rows by position (logits_all), else 1 row.")
    _last_logits = property(lambda self: self._seq.last_logits)
    _requires_eval = property(lambda self: self._seq.requires_eval)
    _sampler = property(lambda self: self._seq.sampler, lambda self, s: setattr(self._seq, "sampler", s))
    _seed = property(lambda self: self._seq.seed, lambda self, s: setattr(self._seq, "seed", s))

    @property
    def _input_ids(self) -> np.ndarray:
        """Tokens currently in the KV cache (a view of ``input_ids``)."""
        return self._seq.tokens

    @_input_ids.setter
    def _input_ids(self, tokens) -> None:
        self._seq.set_tokens(tokens)

    @property
    def _scores(self) -> np.ndarray:
        """Logits rows: every cached position with logits_all, else the last one (1 row)."""
        return self._seq.rows()

    def last_logits(self) -> Optional[np.ndarray]:
        """float32 logits (n_vocab) after the last evaluated token; None before any eval."""
        return self._seq.last_logits

    # ---- tokens ---------------------------------------------------------------

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> List[int]:
        """Token ids of UTF-8 ``text`` (llama.cpp's tokenizer)."""
        return self._tok.tokenize(text, add_bos=add_bos, special=special)

    def prompt_tokens(self, prompt: Union[str, List[int]], suffix: Optional[str] = None) -> List[int]:
        """The tokens :meth:`create_completion` evaluates for ``prompt`` (and ``suffix``):
        BOS as the vocabulary adds it, special tokens parsed, the infill layout with a suffix."""
        return prompt_tokens(self._tok, prompt, suffix, self.spm_infill)[0]

    def detokenize(
        self, tokens: Sequence[int], prev_tokens: Optional[Sequence[int]] = None, special: bool = False
    ) -> bytes:
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

    def is_eog(self, token: int) -> bool:
        """End-of-generation token (EOS, EOT, <|endoftext|>, ...), as llama.cpp decides (cached)."""
        return self._tok.is_eog(token)

    _is_eog = is_eog  # the name llama-cpp-python code and older callers use

    # ---- evaluation -------------------------------------------------------------

    def set_cache(self, cache) -> None:
        """Use a llama-cpp-python prompt cache (``LlamaRAMCache`` / ``LlamaDiskCache``)."""
        self.cache = cache

    def set_seed(self, seed: int) -> None:
        """Seed for the next sampler chain (0xFFFFFFFF = random)."""
        self._seq.seed = seed

    def reset(self) -> None:
        """Forget all tokens (the KV cache is reused from position 0)."""
        self._check_open()
        self._seq.reset()

    def eval(self, tokens: Sequence[int]) -> None:
        """Append ``tokens`` to the sequence and compute their logits.

        Raises:
            ValueError: the sequence would exceed n_ctx, or a token id is out of range.
        """
        self._seq.eval(tokens)

    def sample(
        self,
        top_k: int = 40,
        top_p: float = 0.95,
        min_p: float = 0.05,
        typical_p: float = 1.0,
        temp: float = 0.80,
        repeat_penalty: float = 1.0,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        tfs_z: float = 1.0,
        mirostat_mode: int = 0,
        mirostat_eta: float = 0.1,
        mirostat_tau: float = 5.0,
        penalize_nl: bool = True,
        logits_processor=None,
        grammar=None,
        idx: Optional[int] = None,
    ) -> int:
        """Sample a token id from the logits at position ``idx`` (default: the last),
        with llama.cpp's sampler chain (the one of the running ``generate``, else a new
        one seeded with the current seed, as llama-cpp-python).

        Raises:
            RuntimeError: nothing evaluated yet. ValueError: ``idx`` has no kept logits.
        """
        params = SamplingParams(
            top_k=top_k,
            top_p=top_p,
            min_p=min_p,
            typical_p=typical_p,
            temp=temp,
            repeat_penalty=repeat_penalty,
            frequency_penalty=frequency_penalty,
            presence_penalty=presence_penalty,
            tfs_z=tfs_z,
            mirostat_mode=mirostat_mode,
            mirostat_tau=mirostat_tau,
            mirostat_eta=mirostat_eta,
            penalize_nl=penalize_nl,
            logits_processor=logits_processor,
            grammar=grammar,
        )
        return self._seq.sample(params, idx=idx)

    def generate(
        self,
        tokens: Sequence[int],
        top_k: int = 40,
        top_p: float = 0.95,
        min_p: float = 0.05,
        typical_p: float = 1.0,
        temp: float = 0.80,
        repeat_penalty: float = 1.0,
        reset: bool = True,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        tfs_z: float = 1.0,
        mirostat_mode: int = 0,
        mirostat_tau: float = 5.0,
        mirostat_eta: float = 0.1,
        penalize_nl: bool = True,
        logits_processor=None,
        stopping_criteria=None,
        grammar=None,
    ) -> Iterator[int]:
        """Yield sampled tokens after ``tokens``, endlessly (the caller stops); send a
        list of tokens to the generator to append them after the yielded one.

        With ``reset`` the KV cache of the longest common prefix with the previous
        sequence is kept and only the rest is evaluated (prompt reuse), as
        llama-cpp-python's ``generate``.
        """
        params = SamplingParams(
            top_k=top_k,
            top_p=top_p,
            min_p=min_p,
            typical_p=typical_p,
            temp=temp,
            repeat_penalty=repeat_penalty,
            frequency_penalty=frequency_penalty,
            presence_penalty=presence_penalty,
            tfs_z=tfs_z,
            mirostat_mode=mirostat_mode,
            mirostat_tau=mirostat_tau,
            mirostat_eta=mirostat_eta,
            penalize_nl=penalize_nl,
            logits_processor=logits_processor,
            grammar=grammar,
        )
        return self._seq.generate(tokens, params, reset=reset, stopping_criteria=stopping_criteria)

    def run(
        self,
        tokens: Sequence[int],
        params: SamplingParams,
        *,
        max_tokens: int,
        stops: Sequence[str] = (),
        stream: Optional[str] = None,
        stopping_criteria=None,
    ) -> Iterator[runner.Event]:
        """Generate after ``tokens`` on this model's sequence: the runner's typed events
        (:mod:`powerinfer_backend.text.runner`: ``Token`` per generated token, ``Delta``
        text pieces when ``stream`` is "chars" or "tokens", then ``Stop`` and ``Usage``, or
        ``Error``), ending after at most ``max_tokens`` tokens, at an end-of-generation
        token or at the first of ``stops`` found in the text. The completion, chat and
        server routes render from these.

        Raises:
            ValueError: ``stream`` other than None, "chars" or "tokens".
            RuntimeError: the model is closed.
        """
        if stream not in (None, "chars", "tokens"):
            raise ValueError(f'stream must be None, "chars" or "tokens", got {stream!r}')
        self._check_open()
        text = PieceText(self._tok.piece, self._tok.token_bos)
        req = runner.Request(
            list(tokens),
            params,
            text,
            int(max_tokens),
            self._tok.is_eog,
            [s.encode("utf-8") for s in stops],
            stream=stream,
            stopping_criteria=stopping_criteria,
        )
        return runner.run(self._seq, req)

    # ---- completion, chat, embeddings ---------------------------------------------------------

    def create_completion(
        self,
        prompt: Union[str, List[int]],
        suffix: Optional[str] = None,
        max_tokens: Optional[int] = 16,
        temperature: float = 0.8,
        top_p: float = 0.95,
        min_p: float = 0.05,
        typical_p: float = 1.0,
        logprobs: Optional[int] = None,
        echo: bool = False,
        stop: Optional[Union[str, List[str]]] = [],  # noqa: B006 - llama_cpp's default; never mutated
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        repeat_penalty: float = 1.0,
        top_k: int = 40,
        stream: bool = False,
        seed: Optional[int] = None,
        tfs_z: float = 1.0,
        mirostat_mode: int = 0,
        mirostat_tau: float = 5.0,
        mirostat_eta: float = 0.1,
        model: Optional[str] = None,
        stopping_criteria=None,
        logits_processor=None,
        grammar=None,
        logit_bias: Optional[Dict[int, float]] = None,
    ):
        """Complete ``prompt``: llama-cpp-python's result dict, or (``stream``) an iterator
        of its stream chunks (text.completion: the same stop, stream, echo, logprobs and
        seed rules). ``max_tokens`` None or <= 0: until EOS or the context end.

        Raises:
            ValueError: prompt longer than the context window
                ("Requested tokens (N) exceed context window of M"); logprobs without
                logits_all; a non-finite temperature. With ``stream`` the prompt errors
                come from the first ``next()``, as llama-cpp-python's.
            TypeError: a prompt that is neither a str nor a list of token ids.
            RuntimeError: an empty prompt with nothing cached; the model is closed.
        """
        if isinstance(prompt, np.ndarray):
            prompt = prompt.tolist()
        elif isinstance(prompt, tuple):
            prompt = list(prompt)
        if not isinstance(prompt, (str, list)):
            raise TypeError(f"prompt must be a str or a list of token ids, got {type(prompt).__name__}")
        if not math.isfinite(temperature):  # llama.cpp's chain would sample from NaN logits
            raise ValueError(f"temperature must be a finite number, got {temperature}")
        self._check_open()
        params = SamplingParams(
            top_k=top_k,
            top_p=top_p,
            min_p=min_p,
            typical_p=typical_p,
            temp=temperature,
            repeat_penalty=repeat_penalty,
            frequency_penalty=frequency_penalty,
            presence_penalty=presence_penalty,
            tfs_z=tfs_z,
            mirostat_mode=mirostat_mode,
            mirostat_tau=mirostat_tau,
            mirostat_eta=mirostat_eta,
            logits_processor=logits_processor,
            grammar=grammar,
        )
        opts = Options(
            prompt=prompt,
            suffix=suffix,
            max_tokens=max_tokens,
            logprobs=logprobs,
            echo=echo,
            stop=stop,
            stream=stream,
            seed=seed,
            model=model,
            stopping_criteria=stopping_criteria,
            logit_bias=logit_bias,
        )
        chunks = completion(self, self._tok, self._seq, opts, params)
        return chunks if stream else next(chunks)

    __call__ = create_completion

    def create_chat_completion(self, messages, **kwargs):
        """Chat completion, as llama-cpp-python's: the chat handler of ``chat_handler`` /
        ``chat_format`` / the GGUF template formats ``messages`` and calls
        :meth:`create_completion` (tools, tool_choice, response_format, streaming).
        Keywords: llama-cpp-python's ``create_chat_completion`` ones."""
        return chat.complete(self, messages, kwargs)

    def create_chat_completion_openai_v1(self, *args, **kwargs):
        """``create_chat_completion`` as ``openai`` types (needs the openai package)."""
        return chat.as_openai_v1(lambda: self.create_chat_completion(*args, **kwargs), kwargs.get("stream", False))

    @classmethod
    def from_pretrained(
        cls,
        repo_id: str,
        filename: str,
        additional_files: Optional[List] = None,
        local_dir=None,
        local_dir_use_symlinks="auto",
        cache_dir=None,
        **kwargs,
    ) -> "Llama":
        """Download ``filename`` (a glob) of the Hugging Face repository ``repo_id`` and load it
        (:func:`powerinfer_backend.loader.hub.from_pretrained`; needs huggingface-hub)."""
        path = from_pretrained(
            repo_id,
            filename,
            additional_files=additional_files,
            local_dir=local_dir,
            local_dir_use_symlinks=local_dir_use_symlinks,
            cache_dir=cache_dir,
        )
        return cls(model_path=path, **kwargs)

    logits_to_logprobs = staticmethod(log_softmax)
    longest_token_prefix = staticmethod(common_prefix)

    def create_embedding(self, input: Union[str, List[str]], model: Optional[str] = None):
        """llama-cpp-python's embedding response over :meth:`embed`: ``{"object": "list",
        "data": [{"object": "embedding", "embedding", "index"}], "model", "usage"}``."""
        inputs = input if isinstance(input, list) else [input]
        embeds, total = self.embed(inputs, return_count=True)
        return {
            "object": "list",
            "data": [{"object": "embedding", "embedding": e, "index": i} for i, e in enumerate(embeds)],
            "model": model if model is not None else self.model_path,
            "usage": {"prompt_tokens": total, "total_tokens": total},
        }

    def embed(
        self, input: Union[str, List[str]], normalize: bool = False, truncate: bool = True, return_count: bool = False
    ):
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
        return LlamaState(
            input_ids=self.input_ids.copy(),
            scores=self._scores.copy(),
            n_tokens=self.n_tokens,
            llama_state=_STATE_MAGIC,
            llama_state_size=len(_STATE_MAGIC),
            seed=self._seed,
        )

    def load_state(self, state: "LlamaState") -> None:
        """Restore a state from :meth:`save_state` (tokens, logits, seed, KV cache)."""
        if bytes(state.llama_state[: len(_STATE_MAGIC)]) != _STATE_MAGIC:
            raise ValueError(
                "load_state: not a powerinfer_backend state (llama.cpp context states cannot be "
                "loaded into this engine)"
            )
        self._seq.restore(state.input_ids[: int(state.n_tokens)], state.scores)
        self._seq.seed = state.seed

    # ---- lifetime -------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._backend is _CLOSED:
            raise RuntimeError(_CLOSED_MESSAGE)

    def close(self) -> None:
        """Free the native model, context, tokenizer and sampler."""
        if getattr(self, "_announced", False):
            self._announced = False
            plugin_manager().hook.powerinfer_backend_model_unloaded(llama=self)
        seq = getattr(self, "_seq", None)
        if seq is not None:
            seq.close_sampler()
            seq.last_logits = None  # may be a view of the native context's buffer
            seq.evaluator = _CLOSED
        for part in ("_backend", "_tok"):
            obj = getattr(self, part, None)
            if obj is not None and obj is not _CLOSED:
                setattr(self, part, _CLOSED)
                obj.close()

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
