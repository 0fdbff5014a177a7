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
    "down_cache": "engine.down_cache",
    "sidecar": "sparsity.sidecar",
    "calibrate": "sparsity.calibrate",
    "perplexity": "sparsity.perplexity",
    "predictor": "sparsity.predictors",
    "train_predictor": "sparsity.train",
    "placement": "hybrid.placement",
    "offload": "hybrid.offload",
    "device": "hybrid.devices",
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


# names an old module had that now live in a higher layer than its new home (which may
# not import them): set on the new module when the old name is imported
EXTRA = {"pwri": {"pwri_predictors": "sparsity.predictors"}}


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str, extra: dict | None = None, package: str = ""):
        self.target, self.extra, self.package = target, extra or {}, package

    def create_module(self, spec):
        module = importlib.import_module(self.target)
        self.spec = module.__spec__  # importlib overwrites __spec__ with the alias's; put back below
        for name, source in self.extra.items():
            setattr(module, name, getattr(importlib.import_module(f"{self.package}.{source}"), name))
        return module

    def exec_module(self, module):  # already executed under its new name: keep its own spec
        module.__spec__ = self.spec


class _AliasFinder(importlib.abc.MetaPathFinder):
    def __init__(self, package: str):
        self.prefix = package + "."

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith(self.prefix):
            return None
        old, _, sub = fullname[len(self.prefix):].partition(".")
        new = MOVED.get(old)
        if new is None:
            return None
        # a submodule under an old name (powerinfer_backend.placement.budget) is the new one too
        target_name = self.prefix + new + ("." + sub if sub else "")
        if target_name == fullname:
            return None
        extra = None if sub else EXTRA.get(old)
        return importlib.util.spec_from_loader(fullname, _AliasLoader(target_name, extra, self.prefix[:-1]))


def install(package: str) -> None:
    """Make the old names of ``package`` importable (idempotent). First on sys.meta_path,
    so that an old name's submodules resolve to the new modules rather than loading their
    files a second time through the aliased package's __path__."""
    if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _AliasFinder(package))
