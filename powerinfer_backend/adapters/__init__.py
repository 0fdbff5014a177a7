"""Framework adapters for powerinfer_backend, one subpackage per framework:

* ``powerinfer_backend.adapters.llamacpp`` — ``install()`` makes ``llama_cpp.Llama`` ours,
  so llama-cpp-python's own server and libraries built on it run unmodified
  (docs/adapters/llama-cpp.md);
* ``powerinfer_backend.adapters.langchain`` — LangChain's ``LlamaCpp`` / ``ChatLlamaCpp``
  on our ``Llama`` with ``vram_budget`` (docs/adapters/langchain.md);
* ``powerinfer_backend.adapters.text_generation_webui`` — the "PowerInfer" loader for
  textgen, formerly text-generation-webui (docs/adapters/text-generation-webui.md).

Nothing here is imported by ``import powerinfer_backend``; each subpackage imports its
framework only when used.
"""
