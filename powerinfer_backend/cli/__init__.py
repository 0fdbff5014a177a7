"""The ``cli`` layer (the top, with ``server``): the ``powerinfer-backend`` command
(``commands``), the benchmark against llama.cpp (``bench``) and the FFN density sweep
(``sweeps``)."""

from .commands import (build_parser, cmd_bench, cmd_calibrate, cmd_generate, cmd_perplexity, cmd_plan, cmd_serve,
                       cmd_train_predictor, main)

__all__ = ["main", "build_parser", "cmd_bench", "cmd_calibrate", "cmd_generate", "cmd_perplexity", "cmd_plan",
           "cmd_serve", "cmd_train_predictor"]  # main: the console-script entry point
