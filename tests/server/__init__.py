"""Tests of ``powerinfer_backend.server``: ``powerinfer-backend serve`` over loopback."""
