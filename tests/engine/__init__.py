"""Tests of ``powerinfer_backend.engine``: the native forward pass of every
architecture, against numpy references and llama.cpp."""
