"""Tests of ``powerinfer_backend.loader``: reading GGUF and PWRI files, the artifact store."""
