"""The ``cli`` layer (the top, with ``server``): the ``powerinfer-backend`` command
(``commands``, its argument parser ``parser``), the benchmark against llama.cpp (``bench``) and the FFN density sweep
(``sweeps``)."""

from .commands import cmd_bench, cmd_calibrate, cmd_generate, cmd_perplexity, cmd_plan, cmd_serve, cmd_train_predictor
from .console import main
from .parser import build_parser

__all__ = [
    "main",
    "build_parser",
    "cmd_bench",
    "cmd_calibrate",
    "cmd_generate",
    "cmd_perplexity",
    "cmd_plan",
    "cmd_serve",
    "cmd_train_predictor",
]  # main: the console-script entry point
