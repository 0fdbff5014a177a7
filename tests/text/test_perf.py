"""llama.cpp's timing report (``powerinfer_backend.text.perf``): counters split as
llama.cpp splits them and its ``llama_perf_context_print`` layout."""

from __future__ import annotations

import re

from powerinfer_backend.text.perf import PerfContext


def test_counts_and_layout():
    p = PerfContext(load_s=1.5)
    p.reset_timings()
    p.record(20, 0.1)  # a prompt eval of 20 tokens in 100 ms: 200 tok/s
    p.record(1, 0.01)  # eval runs: 4 x 10 ms = 100 tok/s
    p.record(1, 0.01)
    p.record(1, 0.01)
    p.record(1, 0.01)
    p.record(0, 5.0)  # nothing evaluated: not counted
    r = p.report()
    assert (r["n_prompt"], r["n_eval"]) == (20, 4) and r["load_ms"] == 1500.0
    assert abs(r["prompt_tok_s"] - 200.0) < 1e-9 and abs(r["eval_tok_s"] - 100.0) < 1e-9
    lines = p.format().splitlines()
    assert lines[0] == "llama_perf_context_print:        load time =    1500.00 ms"
    assert lines[1] == (
        "llama_perf_context_print: prompt eval time =     100.00 ms /    20 tokens "
        "(    5.00 ms per token,   200.00 tokens per second)"
    )
    assert lines[2] == (
        "llama_perf_context_print:        eval time =      40.00 ms /     4 runs   "
        "(   10.00 ms per token,   100.00 tokens per second)"
    )
    assert re.fullmatch(r"llama_perf_context_print:       total time = +\d+\.\d\d ms /    24 tokens", lines[3])
    p.reset_timings()  # the load time stays, the rest restarts
    r = p.report()
    assert (r["n_prompt"], r["n_eval"], r["load_ms"], r["eval_tok_s"]) == (0, 0, 1500.0, 0.0)
    assert "(    0.00 ms per token,     0.00 tokens per second)" in p.format()
