"""Tokenizer from the GGUF through llama.cpp (llama-cpp-python, ``vocab_only=True``),
so token ids and detokenized bytes are exactly llama.cpp's."""

from __future__ import annotations

import contextlib
import io
from typing import List, Optional, Sequence


class LlamaCppTokenizer:
    """Tokenize / detokenize with llama.cpp's vocabulary code for a GGUF file.

    Loads only the vocabulary (no weights, no compute context).

    Raises:
        ValueError: llama.cpp cannot read the file's vocabulary.
    """

    def __init__(self, model_path: str):
        import llama_cpp  # heavy import, deferred to first use

        try:
            # llama-cpp-python's log callback prints to sys.stderr even with verbose=False
            # ("n_ctx_seq (512) > n_ctx_train (0)": a vocab-only model has no context length)
            with contextlib.redirect_stderr(io.StringIO()):
                self._vocab_model = llama_cpp.Llama(model_path=model_path, vocab_only=True, verbose=False)
        except Exception as e:  # llama-cpp-python raises ValueError or RuntimeError
            raise ValueError(f"{model_path}: llama.cpp could not load the vocabulary: {e}") from e
        m = self._vocab_model
        self.n_vocab = m.n_vocab()
        self.token_bos = m.token_bos()
        self.token_eos = m.token_eos()
        self.token_nl = m.token_nl()
        self.metadata = dict(m.metadata)

    @property
    def llama(self):
        """The vocab-only ``llama_cpp.Llama`` (for chat formats and grammars)."""
        return self._vocab_model

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> List[int]:
        """Token ids of ``text`` (UTF-8 bytes); BOS only where the model's GGUF asks for it."""
        return self._vocab_model.tokenize(text, add_bos=add_bos, special=special)

    def detokenize(self, tokens: Sequence[int], prev_tokens: Optional[Sequence[int]] = None,
                   special: bool = False) -> bytes:
        """UTF-8 bytes of ``tokens`` (may end inside a multi-byte character)."""
        return self._vocab_model.detokenize(list(tokens), prev_tokens=prev_tokens, special=special)

    def is_eog(self, token: int) -> bool:
        """Whether ``token`` ends generation (EOS, EOT, <|endoftext|>, ...: llama.cpp's EOG set)."""
        import llama_cpp

        return bool(llama_cpp.llama_vocab_is_eog(self._vocab_model._model.vocab, int(token)))

    def close(self) -> None:
        m, self._vocab_model = getattr(self, "_vocab_model", None), None
        if m is not None:
            m.close()
