"""``powerinfer-backend serve`` options and model loading (kept apart from
:mod:`powerinfer_backend.server.app` so the command line builds without the server's
optional dependencies)."""

from __future__ import annotations

import argparse

from .arg_types import RANDOM_SEED, int_in, non_negative, positive, resolve_seed, threads
from .placement_args import add_device_arguments, device_kwargs


def add_arguments(p) -> None:
    """``serve`` options, llama-server's spelling where one exists (text-generation-webui
    passes those flags to the server it starts)."""
    p.add_argument("--model", "-m", help="GGUF file (default: the embedded SmolLM2)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int_in("--port", 0, 65535), default=8000, help="port (default 8000)")
    add_device_arguments(
        p,
        budget_help="device budget: GiB as a number, or a size like 512MiB / 8GiB (default: "
        "$POWERINFER_VRAM_BUDGET, else the device's free memory; 0: CPU only)",
    )
    p.add_argument("--api-key", default=None, help="require this key (Authorization: Bearer KEY)")
    p.add_argument("--alias", "-a", default=None, help="model name reported by /v1/models (default: the file name)")
    p.add_argument(
        "--ctx-size",
        "-c",
        "--ctx",
        dest="ctx_size",
        type=non_negative("--ctx-size"),
        default=2048,
        help="context length in tokens (default 2048; 0 = the model's)",
    )
    p.add_argument(
        "--batch-size",
        "-b",
        type=positive("--batch-size"),
        default=512,
        help="prompt tokens per native call (default 512)",
    )
    p.add_argument(
        "--threads",
        "-t",
        type=threads(),
        default=None,
        help="compute threads, 1 to the CPUs available (default: the physical cores)",
    )
    p.add_argument(
        "--max-queue",
        type=int_in("--max-queue", 0, 1 << 20),
        default=16,
        help="requests that may wait for a slot; more get 503 (default 16)",
    )
    p.add_argument(
        "--parallel",
        "-np",
        type=int_in("--parallel", 1, 256),
        default=1,
        help="requests decoded together, each with n_ctx / N tokens of context (default 1)",
    )
    p.add_argument("--chat-format", default=None, help="llama-cpp-python chat format (default: the GGUF template)")
    p.add_argument(
        "--logits-all",
        action="store_true",
        help="keep logits of every position (needed for OpenAI completion logprobs)",
    )
    p.add_argument(
        "--seed",
        type=int_in("--seed", -1, RANDOM_SEED),
        default=None,
        help=f"the model's sampling seed, 0 to {RANDOM_SEED - 1} (default, -1 or {RANDOM_SEED}: "
        "a random one; a request's own seed takes precedence)",
    )
    p.add_argument("--verbose", action="store_true", help="load information and access log")
    m = p.add_mutually_exclusive_group()
    m.add_argument(
        "--sparse",
        default="auto",
        metavar="{auto,off,threshold,predictor,PATH}",
        help="sparse FFN mode (default auto) or a calibration sidecar path",
    )
    m.add_argument("--dense", dest="sparse", action="store_const", const="off", help="same as --sparse off")
    # llama-server flags that text-generation-webui (and other launchers) pass: accepted, ignored
    g = p.add_argument_group(
        "llama-server flags accepted and ignored", " ".join(f[0] for f in _IGNORED_VALUE + _IGNORED_SWITCH)
    )
    for names in _IGNORED_VALUE:
        g.add_argument(
            *names, dest="_ignored_" + names[0].lstrip("-").replace("-", "_"), default=None, help=argparse.SUPPRESS
        )
    for names in _IGNORED_SWITCH:
        g.add_argument(
            *names,
            dest="_ignored_" + names[0].lstrip("-").replace("-", "_"),
            action="store_true",
            help=argparse.SUPPRESS,
        )


_IGNORED_VALUE = [
    ("--ubatch-size", "-ub"),
    ("--flash-attn", "-fa"),
    ("--fit",),
    ("--fit-ctx",),
    ("--fit-target",),
    ("--threads-batch", "-tb"),
    ("--cache-type-k", "-ctk"),
    ("--cache-type-v", "-ctv"),
    ("--split-mode", "-sm"),
    ("--tensor-split", "-ts"),
    ("--numa",),
    ("--mmproj",),
    ("--model-draft",),
    ("--draft-max",),
    ("--draft-min",),
    ("--ctx-size-draft",),
    ("--gpu-layers-draft",),
    ("--device-draft",),
    ("--spec-type",),
    ("--spec-ngram-size-n",),
    ("--spec-ngram-size-m",),
    ("--spec-ngram-min-hits",),
    ("--cache-reuse",),
    ("--rpc",),
    ("--spec-draft-n-max",),
    ("--spec-ngram-mod-n-match",),
    ("--spec-ngram-mod-n-min",),
]
# llama-server's per-kind n-gram speculation flags (textgen passes those of the kind chosen)
_IGNORED_VALUE += [
    (f"--spec-{kind}-{what}",)
    for kind in ("ngram-simple", "ngram-map-k", "ngram-map-k4v")
    for what in ("size-n", "size-m", "min-hits")
]
_IGNORED_SWITCH = [
    ("--no-webui",),
    ("--no-mmap",),
    ("--mlock",),
    ("--cpu-moe",),
    ("--no-kv-offload",),
    ("--swa-full",),
    ("--jinja",),
    ("--cont-batching",),
    ("--metrics",),
]


def load_llama(args, vram_budget=None):
    """The served ``Llama``; ``vram_budget``: :func:`.placement_args.env_budget`'s answer
    (the flag, else the environment)."""
    from ..llama import Llama
    from ..loader.models import default_model_path

    seqs = {"n_seq_max": args.parallel} if args.parallel > 1 else {}
    return Llama(
        args.model or default_model_path(),
        n_ctx=args.ctx_size,
        n_batch=args.batch_size,
        n_threads=args.threads,
        sparse=args.sparse,
        chat_format=args.chat_format,
        logits_all=args.logits_all,
        embedding=True,
        seed=resolve_seed(args.seed),
        verbose=args.verbose,
        **device_kwargs(args, vram_budget),
        **seqs,
    )
