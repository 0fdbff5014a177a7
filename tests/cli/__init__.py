"""Tests of ``powerinfer_backend.cli``: the ``powerinfer-backend`` command line."""
