"""``python -m powerinfer_backend.adapters.text_generation_webui --tgw-dir DIR [server.py args]``:
run text-generation-webui's ``server.py`` with the "PowerInfer" loader registered."""

from __future__ import annotations

import argparse
import os
import runpy
import sys

from ...server.placement_args import budget_arg


def main(argv=None) -> int:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument(
        "--tgw-dir",
        default=os.environ.get("TGW_DIR"),
        help="textgen (text-generation-webui) checkout (default: $TGW_DIR)",
    )
    p.add_argument(
        "--vram-budget",
        type=budget_arg,
        default=None,
        help="default vram_budget: GiB as a number, or a size (512MiB, 8GiB)",
    )
    ours, rest = p.parse_known_args(sys.argv[1:] if argv is None else argv)
    if not ours.tgw_dir or not os.path.isfile(os.path.join(ours.tgw_dir, "server.py")):
        print(
            "powerinfer tgw launcher: --tgw-dir (or TGW_DIR) must point at a textgen (text-generation-webui) "
            "checkout, the folder with server.py",
            file=sys.stderr,
        )
        return 2
    if ours.vram_budget is not None:
        os.environ["POWERINFER_VRAM_BUDGET"] = str(ours.vram_budget)
    tgw = os.path.abspath(ours.tgw_dir)
    os.chdir(tgw)
    sys.path.insert(0, tgw)
    sys.argv = [os.path.join(tgw, "server.py"), *rest]
    import modules.shared  # noqa: F401 - parses tgw's command line (sys.argv)

    from . import apply

    apply()
    runpy.run_path(os.path.join(tgw, "server.py"), run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
