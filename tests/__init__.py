"""The test suite. Folders mirror the package's layers (``tests/loader/`` tests
``powerinfer_backend.loader``, ...); project-level tests (layering, wheel) and the public
``Llama`` tests sit here. Shared pytest fixtures: ``conftest.py``; shared helpers (tiny
GGUF writers, references, the server subprocess, paths): ``tests.fixtures``."""
