"""Tokenizer from the GGUF through llama.cpp (llama-cpp-python, ``vocab_only=True``),
so token ids and detokenized bytes are exactly llama.cpp's."""

from __future__ import annotations

import contextlib
import ctypes
import io
import threading
from typing import List, Optional, Sequence


def llama_cpp_class():
    """llama-cpp-python's own ``Llama`` class, also while the llama-cpp drop-in
    (``powerinfer_backend.adapters.llamacpp.install()``) has put ours in its place as
    ``llama_cpp.Llama`` (it leaves the defining module's name alone)."""
    from llama_cpp.llama import Llama

    return Llama


class LlamaCppTokenizer:
    """Tokenize / detokenize with llama.cpp's vocabulary code for a GGUF file.

    Loads only the vocabulary (no weights, no compute context).

    Raises:
        ValueError: llama.cpp cannot read the file's vocabulary, or it holds contents on
            which llama.cpp would abort the process (checked first:
            :func:`powerinfer_backend.loader.vocab.check_vocab`).
    """

    def __init__(self, model_path: str, n_ctx: int = 512, chat_format: Optional[str] = None):
        import llama_cpp  # heavy import, deferred to first use

        from ..loader.pwri import vocab_path
        from ..loader.vocab import check_vocab

        given = model_path
        model_path = vocab_path(model_path)  # a PowerInfer (PWRI) file: a GGUF copy of its metadata
        # errors name the file the caller gave, and the metadata copy llama.cpp reads if there is one
        named = given if model_path == given else f"{given} (its metadata copy {model_path})"
        try:
            check_vocab(model_path)  # the file llama.cpp gets: some vocabularies abort the process
        except ValueError as e:
            if model_path == given:
                raise
            raise ValueError(f"{given}: {e}") from e
        try:
            # llama-cpp-python's log callback prints to sys.stderr even with verbose=False
            # ("n_ctx_seq (512) > n_ctx_train (0)": a vocab-only model has no context length).
            # n_ctx: its (weightless, KV-less) context reports our context length to
            # llama-cpp-python code that asks llama_n_ctx(ctx) (an error message in completion).
            with contextlib.redirect_stderr(io.StringIO()):
                self._vocab_model = llama_cpp_class()(
                    model_path=model_path,
                    vocab_only=True,
                    verbose=False,
                    n_ctx=max(1, int(n_ctx)),
                    chat_format=chat_format,
                )
        except Exception as e:  # llama-cpp-python raises ValueError or RuntimeError
            raise ValueError(f"{named}: llama.cpp could not load the vocabulary: {e}") from e
        m = self._vocab_model
        self.n_vocab = m.n_vocab()
        self.token_bos = m.token_bos()
        self.token_eos = m.token_eos()
        self.token_nl = m.token_nl()
        self.metadata = dict(m.metadata)
        self.vocab = llama_cpp.llama_model_get_vocab(m.model)  # llama_vocab_p: grammars, EOG, pieces
        self.token_sep = llama_cpp.llama_vocab_sep(self.vocab)
        self.add_bos = bool(llama_cpp.llama_vocab_get_add_bos(self.vocab))
        self.add_eos = bool(llama_cpp.llama_vocab_get_add_eos(self.vocab))
        self._eog: dict = {}
        self._pieces: tuple[dict[int, bytes], dict[int, bytes]] = ({}, {})  # special=False / True: token -> bytes
        self._buf = ctypes.create_string_buffer(64)
        self._buf_lock = threading.Lock()  # the server's slot threads detokenize at once
        # the last long detokenize: (tokens, joined pieces, special)
        self._last: tuple[list[int], bytes, bool] = ([], b"", False)

    @property
    def llama(self):
        """The vocab-only ``llama_cpp.Llama`` (for chat formats and grammars)."""
        return self._vocab_model

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> List[int]:
        """Token ids of ``text`` (UTF-8 bytes); BOS only where the model's GGUF asks for it."""
        return self._vocab_model.tokenize(text, add_bos=add_bos, special=special)

    def piece(self, token: int, special: bool = False) -> bytes:
        """llama_token_to_piece of one token (cached)."""
        cache = self._pieces[1 if special else 0]
        p = cache.get(token)
        if p is None:
            import llama_cpp

            with self._buf_lock:  # one buffer: another thread's piece would overwrite it (and the cache)
                n = llama_cpp.llama_token_to_piece(
                    self.vocab, llama_cpp.llama_token(int(token)), self._buf, len(self._buf), 0, bool(special)
                )
                if n < 0:  # -n is the length the piece needs: grow the buffer once and retry
                    self._buf = ctypes.create_string_buffer(-n)
                    n = llama_cpp.llama_token_to_piece(
                        self.vocab, llama_cpp.llama_token(int(token)), self._buf, len(self._buf), 0, bool(special)
                    )
                if n < 0:
                    raise ValueError(f"detokenize: token {token} has no piece (llama_token_to_piece returned {n})")
                p = cache[token] = self._buf.raw[:n]
        return p

    def detokenize(
        self, tokens: Sequence[int], prev_tokens: Optional[Sequence[int]] = None, special: bool = False
    ) -> bytes:
        """UTF-8 bytes of ``tokens`` (may end inside a multi-byte character).

        The same bytes as llama-cpp-python's ``LlamaModel.detokenize`` (pieces joined; a
        leading space dropped after a leading BOS; ``prev_tokens`` ignored, as there),
        from cached pieces: completion and streaming call this once or more per token.
        """
        tokens = tokens if isinstance(tokens, list) else list(tokens)
        last_tokens, last_raw, last_special = self._last
        n = len(last_tokens)
        if special == last_special and len(tokens) > n > 0 and tokens[:n] == last_tokens:
            # the completion loop re-detokenizes its growing token list every step
            raw = last_raw + b"".join([self.piece(t, special) for t in tokens[n:]])
        else:
            raw = b"".join([self.piece(t, special) for t in tokens])
        if len(tokens) > 8:
            self._last = (tokens.copy(), raw, special)
        if raw[:1] == b" " and tokens and tokens[0] == self.token_bos:
            return raw[1:]
        return raw

    def is_eog(self, token: int) -> bool:
        """Whether ``token`` ends generation (EOS, EOT, <|endoftext|>, ...: llama.cpp's EOG set; cached)."""
        eog = self._eog.get(token)
        if eog is None:
            import llama_cpp

            eog = self._eog[token] = bool(llama_cpp.llama_vocab_is_eog(self.vocab, int(token)))
        return eog

    def token_text(self, token: int) -> str:
        """The vocabulary's text of ``token`` (``<|im_end|>`` for a special token; llama_vocab_get_text)."""
        import llama_cpp

        return llama_cpp.llama_vocab_get_text(self.vocab, int(token)).decode("utf-8")

    def close(self) -> None:
        m, self._vocab_model = getattr(self, "_vocab_model", None), None
        if m is not None:
            m.close()
