"""The device placement flags every model-loading command shares (``serve`` here,
``generate`` and ``perplexity`` in the cli, which may import the server layer): the
budget as a size, ``--device``, ``--device-threads``, ``--placement`` and llama.cpp's
``-ngl``, spelled and checked the same way everywhere, and their ``Llama`` keywords."""

from __future__ import annotations

import argparse
import os
from typing import Optional

from .arg_types import threads

#: the environment variable ``serve`` takes its budget from when --vram-budget is absent
#: (text-generation-webui's loader sets it)
BUDGET_ENV = "POWERINFER_VRAM_BUDGET"


def budget_arg(value: str) -> str:
    """argparse type of ``--vram-budget``: GiB as a number or a size (``512MiB``, ``8GiB``),
    checked now and passed on as written (``Llama`` parses it again).

    Raises:
        argparse.ArgumentTypeError: not a size (the parser's usage error, exit 2).
    """
    from ..hybrid.placement import parse_vram_budget

    try:
        parse_vram_budget(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return value


def gpu_layers_arg(value: str) -> Optional[int]:
    """argparse type of ``-ngl``: an integer >= -1, ``all`` (-1) or ``auto`` (None: not given),
    as llama.cpp's ``--n-gpu-layers``.

    Raises:
        argparse.ArgumentTypeError: anything else.
    """
    v = value.strip().lower()
    if v == "auto":
        return None
    if v == "all":
        return -1
    try:
        n = int(v)
    except ValueError:
        n = -2
    if n < -1:
        raise argparse.ArgumentTypeError(f"--n-gpu-layers must be an integer >= -1, 'all' or 'auto', got {value!r}")
    return n


def add_repack_argument(p) -> None:
    """Add ``--no-repack`` / ``-nr`` (llama-server's flag; ``args.repack``, True by default) to the parser ``p``."""
    p.add_argument(
        "--no-repack",
        "-nr",
        dest="repack",
        action="store_false",
        help="keep the file's rows (default: Q4_0 / Q5_0 / Q8_0 / Q4_K / Q5_K / Q6_K matrices copied into row groups "
        "at load, "
        "faster on the CPU, one private copy per process; processes serving one file share its pages only with this)",
    )


def add_device_arguments(p, *, budget_help: Optional[str] = None) -> None:
    """Add ``--vram-budget``, ``--device``, ``--device-threads``, ``--placement``,
    ``--device-bandwidth``, ``-ngl`` / ``--n-gpu-layers`` / ``--gpu-layers`` and where the
    weights live on the CPU, ``--no-repack`` / ``-nr`` (:func:`add_repack_argument`), to the parser ``p``."""
    add_repack_argument(p)
    p.add_argument(
        "--vram-budget",
        type=budget_arg,
        default=None,
        help=budget_help or "device budget: GiB as a number, or a size like 512MiB / 8GiB (default: none)",
    )
    p.add_argument(
        "--device",
        default=None,
        help="auto (default: the first discrete GPU, else CPU only), cuda, metal, vulkan, hip, a ggml "
        "device name (`powerinfer-backend devices`), ggml-cpu (ggml's CPU backend as the device), "
        "or cpu",
    )
    p.add_argument(
        "--device-threads",
        type=threads("--device-threads"),
        default=None,
        help="threads of ggml-cpu as the device (default 1)",
    )
    p.add_argument(
        "--placement",
        choices=("auto", "neurons", "layers"),
        default="auto",
        help="auto (default: the fastest predicted of the throughput planner, hot neurons by frequency "
        "and whole layers), neurons, or layers (whole layers as llama.cpp's -ngl)",
    )
    p.add_argument(
        "--device-bandwidth",
        type=float,
        default=None,
        metavar="GB/s",
        help="the device's memory bandwidth for --placement auto (default: a table of common GPUs)",
    )
    p.add_argument(
        "--n-gpu-layers",
        "-ngl",
        "--gpu-layers",
        dest="n_gpu_layers",
        type=gpu_layers_arg,
        default=None,
        metavar="N",
        help="llama.cpp's layer count, used only without --vram-budget: N whole layers' "
        "bytes become the budget (-1 / all: everything); said on stderr",
    )


def device_kwargs(args, vram_budget=None) -> dict:
    """The ``Llama`` keywords of the flags :func:`add_device_arguments` added (those given);
    ``vram_budget`` overrides ``args.vram_budget`` when not None."""
    budget = args.vram_budget if vram_budget is None else vram_budget
    return {
        k: v
        for k, v in (
            ("vram_budget", budget),
            ("device", args.device),
            ("device_threads", args.device_threads),
            ("placement", args.placement),
            ("device_bandwidth", getattr(args, "device_bandwidth", None)),
            ("n_gpu_layers", args.n_gpu_layers),
            ("repack", None if getattr(args, "repack", True) else False),
        )
        if v is not None
    }


def env_budget(args):
    """``--vram-budget``, else ``$POWERINFER_VRAM_BUDGET``, as ``Llama``'s ``vram_budget``:
    None when neither is given (or the variable is empty), 0 for a zero size (CPU only, as
    text-generation-webui's field means it, and no notice without a device), else the
    size as written.

    Raises:
        ValueError: the variable is not a size (its name and value in the message).
    """
    from ..hybrid.placement import parse_vram_budget

    value = args.vram_budget
    if value is None:
        value = os.environ.get(BUDGET_ENV, "").strip() or None
        if value is None:
            return None
        try:
            parse_vram_budget(value)
        except ValueError as e:
            raise ValueError(f"${BUDGET_ENV}={value!r}: {e}") from None
    return value if parse_vram_budget(value) else 0
