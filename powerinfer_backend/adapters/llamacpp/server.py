"""llama-cpp-python's own server (``python -m llama_cpp.server``) running on
powerinfer_backend's ``Llama``::

    python -m powerinfer_backend.adapters.llamacpp.server --model M.gguf --vram_budget 4 [llama_cpp.server options]

``--vram_budget`` (GiB as a number, or a size: ``512MiB``, ``8GiB``) and ``--sparse`` are
ours; every other option is llama-cpp-python's (it needs ``pip install
'llama-cpp-python[server]'``). ``powerinfer-backend serve`` is the native server of this
project (llama-server endpoints, bounded queue, cancellation); this entry point exists
for setups already built around llama-cpp-python's server.
"""

from __future__ import annotations

import argparse
import sys

from ...server.placement_args import budget_arg
from . import install


def main(argv=None) -> int:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--vram_budget", "--vram-budget", type=budget_arg, default=None)
    p.add_argument("--sparse", default="auto")
    ours, rest = p.parse_known_args(sys.argv[1:] if argv is None else argv)
    install(vram_budget=ours.vram_budget, sparse=ours.sparse)
    from llama_cpp.server.__main__ import main as llama_cpp_server_main

    sys.argv = [sys.argv[0], *rest]
    llama_cpp_server_main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
