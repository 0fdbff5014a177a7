"""Tests of ``powerinfer_backend.adapters``: each framework adapter with the real framework."""
