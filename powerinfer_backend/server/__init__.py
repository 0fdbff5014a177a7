"""Layer 9, ``server``: the OpenAI- and llama-server-compatible HTTP server (FastAPI,
docs/serving.md) and its command-line options. Needs the ``[server]`` extra."""
