"""Tests of ``powerinfer_backend.hybrid``: placement plans and offloading a model under one."""
