"""The ``cli`` layer (the top, with ``server``): the ``powerinfer-backend`` command
(``commands``), the benchmark against llama.cpp (``bench``) and the FFN density sweep
(``sweeps``)."""

from .commands import main  # noqa: F401  (the console-script entry point)
