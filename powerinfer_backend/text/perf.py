"""llama.cpp's timing report for :class:`powerinfer_backend.Llama`: what
``llama_perf_context_print`` prints (load time, prompt eval and eval time with tokens
per second, total time), measured around our own evals.

A verbose ``Llama`` resets its :class:`PerfContext` (``Llama.perf``) before each completion
and prints it after, as a verbose ``llama_cpp.Llama`` reports.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Optional, TextIO

_TAG = "llama_perf_context_print"


@dataclass
class PerfContext:
    """Counters of one context, as llama.cpp keeps them.

    Attributes:
        load_s: seconds the model took to load (not reset).
        prompt_s, n_prompt: seconds and tokens of evals of more than one token (prompt eval).
        eval_s, n_eval: seconds and count of one-token evals (eval runs).
        start: ``time.perf_counter()`` at the last reset (total time counts from it).
    """

    load_s: float = 0.0
    prompt_s: float = 0.0
    n_prompt: int = 0
    eval_s: float = 0.0
    n_eval: int = 0
    start: float = field(default_factory=time.perf_counter)

    def record(self, n_tokens: int, seconds: float) -> None:
        """Count one eval of ``n_tokens`` tokens that took ``seconds``."""
        if n_tokens > 1:
            self.prompt_s += seconds
            self.n_prompt += n_tokens
        elif n_tokens == 1:
            self.eval_s += seconds
            self.n_eval += 1

    def reset_timings(self) -> None:
        """Zero the eval counters and restart the total-time clock (load time stays)."""
        self.prompt_s = self.eval_s = 0.0
        self.n_prompt = self.n_eval = 0
        self.start = time.perf_counter()

    def report(self) -> dict:
        """The numbers: ``{"load_ms", "prompt_eval_ms", "n_prompt", "prompt_tok_s", "eval_ms",
        "n_eval", "eval_tok_s", "total_ms"}`` (tok/s 0.0 when nothing was evaluated)."""

        def rate(n, s):
            return n / s if s > 0 else 0.0

        return {
            "load_ms": self.load_s * 1e3,
            "prompt_eval_ms": self.prompt_s * 1e3,
            "n_prompt": self.n_prompt,
            "prompt_tok_s": rate(self.n_prompt, self.prompt_s),
            "eval_ms": self.eval_s * 1e3,
            "n_eval": self.n_eval,
            "eval_tok_s": rate(self.n_eval, self.eval_s),
            "total_ms": (time.perf_counter() - self.start) * 1e3,
        }

    def format(self) -> str:
        """The report in ``llama_perf_context_print``'s layout (four lines)."""
        r = self.report()

        def per(n, ms):
            return (
                f"({ms / n if n else 0.0:8.2f} ms per token, {1e3 * n / ms if ms > 0 else 0.0:8.2f} tokens per second)"
            )

        return "\n".join(
            [
                f"{_TAG}:        load time = {r['load_ms']:10.2f} ms",
                f"{_TAG}: prompt eval time = {r['prompt_eval_ms']:10.2f} ms / {r['n_prompt']:5d} tokens "
                f"{per(r['n_prompt'], r['prompt_eval_ms'])}",
                f"{_TAG}:        eval time = {r['eval_ms']:10.2f} ms / {r['n_eval']:5d} runs   "
                f"{per(r['n_eval'], r['eval_ms'])}",
                f"{_TAG}:       total time = {r['total_ms']:10.2f} ms / {r['n_prompt'] + r['n_eval']:5d} tokens",
            ]
        )

    def print_timings(self, file: Optional[TextIO] = None) -> None:
        """Print :meth:`format` to ``file`` (default stderr, where llama.cpp logs)."""
        print(self.format(), file=file or sys.stderr, flush=True)
