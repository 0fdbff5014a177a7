"""The CI fuzz smoke pass (docs/reliability.md "Fuzzing"): a fixed-seed run of 2,000
mutants of the tiny fixture seeds and of the real SmolLM2 header, each loaded with
``Llama(path, n_ctx=32)`` in a fork of a warm worker. Every input must load or be rejected
with one of our exception types whose message names the file: no crash, no hang, no
unexpected exception type.
``POWERINFER_FUZZ_INPUTS`` changes the count (the sanitizer job runs fewer: .ci/sanitize)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from powerinfer_backend.loader.models import default_model_path
from tests.fuzz import harness

SMOKE_SEED = 0
SMOKE_INPUTS = int(os.environ.get("POWERINFER_FUZZ_INPUTS", "2000"))
REAL_EVERY = 400  # 5 SmolLM2 header mutants in 2,000: each takes ~5 s to read


def _first_bad(saved: list[str]) -> str:
    lines = []
    for path in saved[:5]:
        info = json.loads(Path(path).with_suffix(".json").read_text())
        tail = info["log_tail"].strip().splitlines()[-1:] or [""]
        lines.append(
            f"{path}: {info['outcome']} (status {info['status']}) seed {info['seed']}: "
            f"{info['mutation']} | {tail[0][-200:]} | {(info['result'] or {}).get('exception')}"
        )
    return "\n".join(lines)


def test_fuzz_smoke(tmp_path):
    s = harness.run(SMOKE_INPUTS, SMOKE_SEED, tmp_path, jobs=2, real_model=default_model_path(), real_every=REAL_EVERY)
    print(json.dumps({k: v for k, v in s.as_dict().items() if k != "saved"}))
    assert s.inputs == SMOKE_INPUTS
    # the run reached both ends: files that load and evaluate, and files that are refused
    assert s.outcomes["loaded"] >= SMOKE_INPUTS // 100 and s.outcomes["rejected"] >= SMOKE_INPUTS // 2
    assert s.by_seed[Path(default_model_path()).stem].total() == SMOKE_INPUTS // REAL_EVERY
    bad = {k: s.outcomes[k] for k in harness.BAD_OUTCOMES if s.outcomes[k]}
    assert not bad, f"{bad} of {s.inputs} inputs (saved in {tmp_path}/crashes):\n{_first_bad(s.saved)}"
    # every refusal names the file the caller gave
    assert s.rejected_unnamed == 0, s.unnamed_examples
