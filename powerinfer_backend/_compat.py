"""Old flat module names (``powerinfer_backend.placement``, ``.models``, ...) kept
importable after the move into layer subpackages: each is an alias of the module that
now holds its code (the same module object, so patches and ``isinstance`` agree)."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

# old name (under powerinfer_backend) -> module that holds it now
MOVED = {
    "arch": "loader.arch",
    "gguf_model": "loader",
    "pwri": "loader.pwri",
    "artifacts": "loader.artifacts",
    "models": "loader.models",
    "engine": "engine",
    "down_cache": "engine.down_cache",
    "sidecar": "sparsity.sidecar",
    "calibrate": "sparsity.calibrate",
    "perplexity": "sparsity.perplexity",
    "predictor": "sparsity.predictors",
    "train_predictor": "sparsity.train",
    "placement": "hybrid.placement",
    "offload": "hybrid.offload",
    "device": "hybrid.devices",
    "cuda_device": "hybrid.devices.cuda",
    "tokenizer": "text.tokenizer",
    "sampling": "text.sampling",
    "hookspecs": "plugins.hookspecs",
    "backends": "plugins.manager",
    "llamacpp_backend": "plugins.llamacpp",
    "llamacpp_ref": "plugins.reference",
    "server_cli": "server.options",
    "bench": "cli.bench",
    "ffn_sweep": "cli.sweeps",
}


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str):
        self.target = target

    def create_module(self, spec):
        return importlib.import_module(self.target)

    def exec_module(self, module):  # already executed under its new name
        pass


class _AliasFinder(importlib.abc.MetaPathFinder):
    def __init__(self, package: str):
        self.prefix = package + "."

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith(self.prefix):
            return None
        new = MOVED.get(fullname[len(self.prefix):])
        if new is None:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(self.prefix + new))


def install(package: str) -> None:
    """Make the old names of ``package`` importable (idempotent)."""
    if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        sys.meta_path.append(_AliasFinder(package))
