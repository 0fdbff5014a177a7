"""Tests of ``powerinfer_backend.plugins``: the plugin manager and backends seen from ``Llama``."""
