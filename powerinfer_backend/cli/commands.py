"""``powerinfer-backend`` command line: ``generate`` streams text (``--chat``: one chat
answer), ``chat`` is an interactive chat in the terminal, ``perplexity`` scores a
text file, ``calibrate`` chooses sparsity thresholds, ``bench`` measures decode and prefill
speed against llama.cpp in the same run (or sweeps FFN densities), ``plan`` shows the VRAM
placement for a budget (docs/placement.md), ``devices`` lists the ggml devices a placement
can use, ``serve`` answers OpenAI- and llama-server-compatible HTTP requests."""

from __future__ import annotations

import json
import os
import sys

from ..server.arg_types import resolve_seed


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
    return Llama(
        _model_path(args.model),
        n_ctx=args.ctx,
        n_threads=args.threads,
        seed=seed,
        verbose=args.verbose,
        sparse=args.sparse,
        **kw,
        **_device_kwargs(args),
    )


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

            messages = [{"role": "system", "content": args.system}] if args.system else []
            _, finish = stream_answer(
                llm, messages + [{"role": "user", "content": args.prompt}], sys.stdout, **_chat_sampling(args)
            )
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
    other = "--ffn-density-sweep" if args.ffn_density_sweep else "--busy" if args.busy is not None else None
    other = other or ("--profile-ops" if args.profile_ops else None)
    if other is not None and (args.runs > 1 or args.roofline):
        raise ValueError(f"{'--runs' if args.runs > 1 else '--roofline'} does not apply to bench {other}")
    if not args.repack and other in ("--ffn-density-sweep", "--busy"):  # the sweep has no model; busy: the defaults
        raise ValueError(f"--no-repack does not apply to bench {other}")
    if args.ffn_density_sweep:
        from .sweeps import format_sweep, run_sweep

        result = run_sweep(
            n_embd=args.n_embd, n_ff=args.n_ff, n_threads=args.threads, mib=args.mib, rounds=args.repeats * 5
        )
        print(json.dumps(result, indent=2) if args.json else format_sweep(result))
        return 0
    model = _model_path(args.model)
    timing = {"n_threads": args.threads, "n_decode": args.n_decode, "repeats": args.repeats}
    if args.busy is not None:
        from .busy import format_busy, run_busy_bench

        result = run_busy_bench(model, n_busy=args.busy, **timing)
        print(json.dumps(result, indent=2) if args.json else format_busy(result))
        return 0
    if args.profile_ops:
        from .profile_ops import profile_ops_command

        return profile_ops_command(args, model)
    from .bench import format_summary, format_table, run_bench, summarize_runs

    runs = []
    for _ in range(args.runs):  # each run loads both engines afresh, as a user's process would
        load = os.getloadavg()[0]
        if load >= args.threads:  # the engines' threads will wait for cores: ratios measure the neighbours too
            warn_line(
                f"load average {load:.2f} before this run with {args.threads} threads: other processes "
                "share the cores, so its ratios are a busy host's (--busy measures that on purpose)"
            )
        result = run_bench(
            model,
            n_prefill=args.n_prefill,
            include_llama_cpp=not args.no_llama_cpp,
            sparse=args.sparse,
            repack=args.repack,
            **timing,
        )
        result["loadavg_before"] = load
        if args.roofline:  # measured right after the engines, in the same run
            from .roofline import add_roofline

            add_roofline(result, model, n_threads=args.threads, bandwidth_mib=args.roofline_mib)
        runs.append(result)
        if not args.json:
            print(format_table(result), flush=True)
    if args.json:
        out = runs[0] if args.runs == 1 else {"runs": runs, "summary": summarize_runs(runs)}
        print(json.dumps(out, indent=2))
    elif args.runs > 1:
        print(format_summary(summarize_runs(runs)))
    return 0


def cmd_train_predictor(args) -> int:
    from ..sparsity.train import train_predictors

    layers = None if args.layers is None else [int(x) for x in args.layers.split(",") if x.strip()]
    ps = train_predictors(
        _model_path(args.model),
        args.text,
        max_ppl_increase=args.max_ppl_increase,
        recall=args.recall,
        density=args.density,
        select=args.select,
        loss=args.loss,
        quantize=args.quantize,
        allocate=args.allocate,
        max_density=args.max_density,
        probe_tokens=args.probe_tokens,
        rank=args.rank,
        epochs=args.epochs,
        tokens=args.tokens,
        heldout_tokens=args.heldout_tokens,
        n_ctx=args.ctx,
        offset_bytes=args.offset_bytes,
        max_bytes=args.max_bytes,
        out=args.out,
        force=args.force,
        n_threads=args.threads,
        label_sparsity=args.label_sparsity,
        layers=layers,
        backend=args.backend,
        progress=not args.json,
        speed_check=not args.no_speed_check,
    )
    if args.json:
        print(
            json.dumps(
                {
                    "sidecar": ps.source,
                    "layers": ps.layers,
                    "thresholds": [float(ps.thresholds[x]) for x in ps.layers],
                    **{k: v for k, v in ps.info.items()},
                }
            )
        )
    return 0


def cmd_calibrate(args) -> int:
    from ..sparsity.calibrate import calibrate, format_layers

    prof = calibrate(
        _model_path(args.model),
        args.text,
        max_ppl_increase=args.max_ppl_increase,
        target_sparsity=args.target_sparsity,
        tokens=args.tokens,
        heldout_tokens=args.heldout_tokens,
        search_tokens=args.search_tokens,
        n_ctx=args.ctx,
        offset_bytes=args.offset_bytes,
        max_bytes=args.max_bytes,
        out=args.out,
        force=args.force,
        n_threads=args.threads,
        progress=not args.json,
        threshold_on=args.threshold_on,
        speed_check=not args.no_speed_check,
    )
    if args.json:
        print(
            json.dumps(
                {
                    "sidecar": str(prof.path),
                    "thresholds": [float(t) for t in prof.thresholds],
                    "layer_sparsity": [float(x) for x in prof.layer_sparsity],
                    **prof.info,
                }
            )
        )
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
    llm = Llama(
        _model_path(args.model),
        n_ctx=args.ctx,
        n_batch=args.ctx,
        n_threads=args.threads,
        verbose=args.verbose,
        sparse=args.sparse,
        **_device_kwargs(args),
    )
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
        print(
            f"perplexity {result['ppl']:.4f} over {result['tokens']} tokens ({result['chunks']} chunks of "
            f"{args.ctx}), FFN sparsity {result['ffn_sparsity']:.1%}"
        )
    return 0


def cmd_plan(args) -> int:
    from ..hybrid.devices import DeviceSizer, planning_sizer
    from ..hybrid.placement import (
        GPU_SYNC_S,
        ModelSizes,
        budget_after_reserve,
        parse_vram_budget,
        plan_for_model,
        plan_layer_split,
        why_placed_nothing,
        write_plot,
    )
    from ..loader import load_gguf

    model = _model_path(args.model)
    budget = parse_vram_budget(args.vram_budget) or 0  # never None: --vram-budget is required
    if args.predict and args.device_bandwidth is None:
        raise ValueError("plan --predict needs --device-bandwidth GB/s")
    placement = args.placement or ("layers" if args.layer_split else "auto" if args.device_bandwidth else "neurons")
    if placement == "auto" and args.device_bandwidth is None:
        raise ValueError("plan --placement auto needs --device-bandwidth GB/s")
    if args.sync_us is not None and args.device_bandwidth is None:
        raise ValueError("plan --sync-us needs --device-bandwidth GB/s (it is a term of placement auto's cost model)")
    if args.sync_us is None:  # a GPU's round trip, unless the bytes are counted for ggml's CPU backend
        args.sync_us = 0.0 if args.device == "ggml-cpu" else GPU_SYNC_S * 1e6
    inputs = None
    no_device = _no_device_message(args.device)
    out = _plan_file(model, args)
    g = load_gguf(model, verbose=False)
    reserve = 0
    try:  # the device's byte rule (exact), or ggml's CPU buffer rule without one
        from .predict import file_predictors

        preds = file_predictors(g, args)  # Llama's context carries them: its compute buffer too
        with planning_sizer(args.device, g, n_ctx=args.ctx, n_batch=args.batch, predictors=preds) as sizer:
            if isinstance(sizer, DeviceSizer):  # a GPU backend's own buffers come out of the budget, as in Llama
                budget, reserve = budget_after_reserve(budget, sizer.name, sizer.type)
            if placement == "auto" or args.predict:  # the cost model's inputs: the plan counts with their sizes
                from .predict import model_inputs

                inputs = model_inputs(model, args)
            if args.device_skips is not None and (inputs is None or inputs["mode"] != "predictor"):
                warn_line(
                    f"--{'' if args.device_skips else 'no-'}device-skips ignored: it is the cost model's choice "
                    "for mode predictor, with --predict or placement auto"
                    + (f" (the mode here is {inputs['mode']})" if inputs else "")
                )
            sizes = inputs["sizes"] if inputs else ModelSizes.from_gguf(g)
            if inputs is None and preds is not None:  # every layer sparse, as Llama's context in predictor mode
                sizes = sizes.for_mode("predictor")
            if placement == "layers":
                from ..loader.artifacts import atomic_write_json

                plan = plan_layer_split(sizes, budget, n_ctx=args.ctx, n_batch=args.batch, sizer=sizer)
                plan.path = out
                atomic_write_json(plan.path, plan.to_json())
            else:
                auto: dict = {}
                if placement == "auto" and inputs:
                    auto = dict(
                        placement="auto",
                        device_gbps=args.device_bandwidth,
                        host_gbps=inputs["host_gbps"],
                        mode=inputs["mode"],
                        sync_s=args.sync_us / 1e6,
                        predictor_bytes=inputs["predictor_bytes"] if inputs["mode"] == "predictor" else 0,
                        device_skips=args.device_skips,
                    )
                plan = plan_for_model(
                    model,
                    budget,
                    n_ctx=args.ctx,
                    n_batch=args.batch,
                    model=g,
                    sizes=sizes,
                    sparsity_sidecar=args.sidecar or "auto",
                    reset_gpu_index=args.reset_gpu_index,
                    disable_gpu_index=args.disable_gpu_index,
                    out=out,
                    sizer=sizer,
                    **auto,
                )
            empty = (
                why_placed_nothing(plan, sizes, budget, n_ctx=args.ctx, n_batch=args.batch, sizer=sizer)
                if plan.device_bytes == 0 and not args.disable_gpu_index
                else ""
            )
    finally:
        g.close()
    png = None
    if not args.no_plot:
        png = args.png or str(out.with_suffix(".png"))  # out: where the plan was written
        try:
            write_plot(plan, png, force=args.force)
        except ImportError:
            warn_line(
                "no plot written: matplotlib is not installed (pip install '.[plot]' in a clone, "
                "'powerinfer_backend[plot]' from PyPI; --no-plot skips the plot)"
            )
            png = None
    pred = None
    if args.predict:
        from .predict import predict_for_plan

        pred = predict_for_plan(model, plan, args, inputs)
    if args.json:
        d = plan.to_json()
        for layer in d["layers"]:
            layer["n_hot"] = len(layer.pop("hot_ids"))
        d.update(
            plan_file=str(plan.path),
            cached=plan.cached,
            png=png,
            bytes_by_category=plan.bytes_by_category(),
            no_device=no_device or None,
            nothing_placed=empty or None,
            runtime_reserve=reserve,
        )
        if pred is not None:
            d["prediction"] = {k: v for k, v in pred.items() if k != "text"}
        print(json.dumps(d))
    else:
        print(plan.format_table())
        aside = f"{reserve} bytes of --vram-budget set aside for the device backend's own buffers" if reserve else ""
        for line in (aside, empty, no_device):
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
    return (
        f"no GPU: {why}; bytes counted by ggml's CPU buffer rule with an estimated compute buffer "
        f"(a GPU build of llama-cpp-python brings a GPU, docs/building.md; --device ggml-cpu: exact "
        f"for ggml's CPU backend as the device)"
    )


def _mem(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"


def cmd_devices(args) -> int:
    """The devices ggml found (index, name, type, free/total memory, description)."""
    from ..engine import ggml
    from ..hybrid.devices import ggml_lib_dir

    version = ggml.bind()
    devs = ggml.list_devices()
    if args.json:
        print(
            json.dumps(
                {
                    "ggml_version": version,
                    "lib_dir": ggml_lib_dir(),
                    "devices": [
                        {
                            "index": d.index,
                            "name": d.name,
                            "description": d.description,
                            "type": d.type,
                            "free_bytes": d.free_bytes,
                            "total_bytes": d.total_bytes,
                        }
                        for d in devs
                    ],
                }
            )
        )
        return 0
    print(f"ggml {version} from {ggml_lib_dir()}: {len(devs)} device(s)")
    print(f"{'index':>5}  {'name':<12} {'type':<5} {'free':>11} {'total':>11}  description")
    for d in devs:
        print(
            f"{d.index:5d}  {d.name:<12} {d.type:<5} {_mem(d.free_bytes):>11} {_mem(d.total_bytes):>11}  "
            f"{d.description}"
        )
    print("use: --device NAME (or cuda / metal / vulkan / hip / auto); ggml-cpu = ggml's CPU backend as the device")
    return 0


def _device_kwargs(args) -> dict:
    from ..server.placement_args import device_kwargs

    return device_kwargs(args)


def warn_line(message, file=None) -> None:
    """Print ``powerinfer-backend: warning: MESSAGE`` as one line (to stderr by default)."""
    text = " ".join(str(message).split())
    print(f"powerinfer-backend: warning: {text}", file=file or sys.stderr, flush=True)
