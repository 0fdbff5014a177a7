"""textgen's (formerly text-generation-webui, "tgw") loader "PowerInfer".

tgw has no plugin registry: its loader tables live in ``modules/loaders.py`` and its
dispatch in ``modules/models.py``; its llama.cpp loader (``modules/llama_cpp_server.py``)
starts a ``llama-server`` subprocess and talks to it over HTTP. ``powerinfer-backend serve``
speaks that protocol (``/health``, ``/props``, ``/tokenize``, ``/detokenize``,
``/completion`` with streaming and probabilities, ``/v1/models`` meta) and accepts the
flags tgw passes, so the "PowerInfer" loader is tgw's own llama.cpp path with our server
as the binary, started with ``--vram-budget``:

* :func:`apply` adds "PowerInfer" to ``loaders_and_params`` (``vram_budget``, ``threads``,
  ``batch_size``, ``ctx_size``) and ``loaders_samplers`` (llama.cpp's samplers), adds
  ``vram_budget`` to ``list_model_elements()`` (so ``/v1/internal/model/load`` accepts it)
  and to ``shared.args``, creates its widget in the model menu, and wraps
  ``models.load_model`` so loader "PowerInfer" runs tgw's llama.cpp loader with our server;
* ``python -m powerinfer_backend.adapters.text_generation_webui --tgw-dir DIR [server.py args]``
  applies it and runs tgw's ``server.py`` (docs/adapters/text-generation-webui.md).

After loading, tgw's internal loader name is "llama.cpp" (its generation, logprobs and
seed code branch on that name); ``shared.powerinfer_loaded`` says ours is loaded. Nothing
needs torch: tgw's CPU-only portable requirements suffice.
"""

from __future__ import annotations

import os
import stat
import sys
import tempfile

LOADER = "PowerInfer"
PARAMS = ["vram_budget", "threads", "batch_size", "ctx_size"]
NEW_ELEMENTS = ["vram_budget"]  # model-menu parameters tgw does not have itself
_applied = False


def launcher_path() -> str:
    """An executable that runs ``powerinfer-backend serve`` with this interpreter (what
    tgw starts in place of ``llama-server``)."""
    d = os.path.join(tempfile.gettempdir(), f"powerinfer-tgw-{os.getuid() if hasattr(os, 'getuid') else 0}")
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "powerinfer-llama-server")
    text = f'#!/bin/sh\nexec "{sys.executable}" -m powerinfer_backend serve "$@"\n'
    try:
        with open(path, encoding="utf-8") as f:
            same = f.read() == text
    except OSError:
        same = False
    if not same:
        tmp = path + f".{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, os.stat(tmp).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        os.replace(tmp, path)
    return path


def _budget_gib(value) -> float:
    """``vram_budget`` as tgw holds it (GiB, a float for its number field) from GiB or a
    size string (``512MiB``, from the API or ``--vram-budget``).

    Raises:
        ValueError: not a size, negative, NaN or infinite (the message names vram_budget).
    """
    from ...hybrid.placement import parse_vram_budget

    if isinstance(value, str):
        value = value.strip()
    return (parse_vram_budget(value) or 0) / 2**30


def apply() -> None:
    """Register the "PowerInfer" loader in the imported tgw ``modules`` (idempotent)."""
    global _applied
    if _applied:
        return
    from modules import loaders, models, shared

    if LOADER not in loaders.loaders_and_params:
        loaders.loaders_and_params[LOADER] = list(PARAMS)
    loaders.loaders_samplers.setdefault(LOADER, loaders.loaders_samplers["llama.cpp"])

    original_elements = loaders.list_model_elements

    def list_model_elements():
        elements = list(original_elements())
        return elements + [e for e in NEW_ELEMENTS if e not in elements]

    loaders.list_model_elements = list_model_elements
    default_budget = _budget_gib(os.environ.get("POWERINFER_VRAM_BUDGET", "0") or 0)
    for ns in (shared.args, getattr(shared, "original_args", None)):
        if ns is not None and not hasattr(ns, "vram_budget"):
            ns.vram_budget = default_budget

    original_load_model = models.load_model

    def load_model(model_name, loader=None):
        name = loader or shared.args.loader
        if name != LOADER:
            return original_load_model(model_name, loader)
        from modules import llama_cpp_server

        tgw_llama_server = llama_cpp_server.LlamaServer
        server_path = launcher_path()

        class LlamaServer(tgw_llama_server):  # the name tgw's dispatch checks
            def __init__(self, model_path, server_path_=None):
                super().__init__(model_path, server_path=server_path)

        # checked before the server starts: a bad budget fails the load with its message
        # (the server's exit would leave tgw holding a model that answers nothing)
        budget = _budget_gib(getattr(shared.args, "vram_budget", 0) or 0)
        old_env = os.environ.get("POWERINFER_VRAM_BUDGET")
        os.environ["POWERINFER_VRAM_BUDGET"] = repr(budget)
        llama_cpp_server.LlamaServer = LlamaServer
        try:
            out = original_load_model(model_name, "llama.cpp")
        finally:
            llama_cpp_server.LlamaServer = tgw_llama_server
            if old_env is None:
                os.environ.pop("POWERINFER_VRAM_BUDGET", None)
            else:
                os.environ["POWERINFER_VRAM_BUDGET"] = old_env
        shared.powerinfer_loaded = out[0] is not None
        return out

    models.load_model = load_model
    for modname in ("modules.api.models", "modules.ui_model_menu", "server"):  # modules that imported the name
        mod = sys.modules.get(modname)
        if mod is not None and getattr(mod, "load_model", None) is original_load_model:
            vars(mod)["load_model"] = load_model

    try:  # the model menu widget (only when the web UI is built)
        from modules import ui_model_menu
    except Exception:
        ui_model_menu = None
    if ui_model_menu is not None and hasattr(ui_model_menu, "create_ui"):
        original_create_ui = ui_model_menu.create_ui

        def create_ui(*args, **kwargs):
            result = original_create_ui(*args, **kwargs)
            import gradio as gr

            shared.gradio["vram_budget"] = gr.Number(
                label="vram_budget (GiB)",
                value=shared.args.vram_budget,
                precision=2,
                minimum=0,
                info="PowerInfer: GPU memory for hot neurons and dense blocks; 0 = CPU only.",
            )
            return result

        ui_model_menu.create_ui = create_ui
    _applied = True


def missing_widgets() -> list:
    """Parameters the "PowerInfer" loader lists for which neither tgw's model menu
    (``shared.gradio['name']`` in ``modules/ui_model_menu.py``, read as text: importing it
    needs tgw's own gradio build) nor this adapter creates a widget (should be empty)."""
    import modules
    from modules import loaders

    src = ""
    for d in modules.__path__:
        try:
            with open(os.path.join(d, "ui_model_menu.py"), encoding="utf-8") as f:
                src = f.read()
            break
        except OSError:
            continue
    return [
        p for p in loaders.loaders_and_params[LOADER] if f"shared.gradio['{p}']" not in src and p not in NEW_ELEMENTS
    ]
