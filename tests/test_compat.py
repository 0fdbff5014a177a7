"""The old flat module names (before the layer folders) keep importing: each is the new
module itself, its submodules are the new submodules, and the names the old modules
exported are there (powerinfer_backend/_compat.py)."""

from __future__ import annotations

import importlib

import pytest

from powerinfer_backend import _compat

OLD_NAMES = {  # old module -> names users imported from it
    "models": ["default_model_path"],
    "placement": ["parse_vram_budget", "plan_for_model", "resolve_budget", "Plan"],
    "gguf_model": ["load_gguf", "GGUFModel", "TensorView", "GGUF_MAGIC", "PWRI_LAYER_TENSORS"],
    "pwri": ["vocab_path", "read_gpuidx", "pwri_predictors"],
    "sidecar": ["sidecar_path", "read_sidecar"],
    "device": ["open_device", "resolve_device"],
    "down_cache": ["transposed_down", "down_t_dtype"],
    "train_predictor": ["train_predictors"],
    "backends": ["create_backend", "plugin_manager"],
}
PACKAGES = {  # old modules that are packages now: the names come from the package
    "sparsity": ["stats", "configure", "MODES"],
    "engine": ["NativeModel", "NativeContext", "FFN_HIST_BINS"],
    "plugins": ["HybridBackend", "powerinfer_backend_register"],
    "cli": ["main", "build_parser"],
    "server": ["create_app", "ModelWorker", "APIError", "ChatBody"],
}


@pytest.mark.parametrize("old", sorted(_compat.MOVED))
def test_old_name_is_the_new_module(old):
    new = f"powerinfer_backend.{_compat.MOVED[old]}"
    module = importlib.import_module(f"powerinfer_backend.{old}")
    assert module is importlib.import_module(new)
    # the module keeps its own identity: its relative imports resolve without an ImportWarning
    assert module.__spec__.name == module.__name__ == new


@pytest.mark.parametrize("old, names", sorted({**OLD_NAMES, **PACKAGES}.items()))
def test_old_names_still_importable(old, names):
    module = importlib.import_module(f"powerinfer_backend.{old}")
    assert [n for n in names if not hasattr(module, n)] == []


def test_submodule_of_an_old_name_is_not_loaded_twice():
    a = importlib.import_module("powerinfer_backend.placement.budget")
    assert a is importlib.import_module("powerinfer_backend.hybrid.placement.budget")
    assert importlib.import_module("powerinfer_backend.device.select") is \
        importlib.import_module("powerinfer_backend.hybrid.devices.select")
