"""The command line's argument checks and help text, on the parser alone (no model load):
every thread count and size is refused with a usage error naming the flag and its limits
(issue 25: `bench --threads 0` printed a false speedup; `generate --threads 1000` ran)."""

from __future__ import annotations

import argparse

import pytest

from powerinfer_backend.cli.parser import build_parser
from powerinfer_backend.server.arg_types import available_cpus

# each command that takes --threads, with the arguments it requires
THREADED = {
    "generate": [],
    "chat": [],
    "perplexity": ["--text", "t.txt"],
    "calibrate": ["--text", "t.txt"],
    "train-predictor": ["--text", "t.txt"],
    "bench": [],
    "plan": ["--vram-budget", "1GiB"],
    "serve": [],
}


def _usage_error(capsys, argv) -> str:
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(argv)
    assert e.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize("command", sorted(THREADED))
def test_thread_counts_outside_one_to_the_cpus_are_refused(command, capsys):
    cpus = available_cpus()
    for bad in ("0", "-4", str(cpus + 1), "1000"):
        line = _usage_error(capsys, [command, *THREADED[command], "--threads", bad])
        assert line.endswith(f"--threads must be in [1, {cpus}], got {bad} ({cpus} CPUs available to this process)"), (
            line
        )
    assert _usage_error(capsys, [command, *THREADED[command], "--threads", "two"]).endswith(
        "--threads must be an integer, got 'two'"
    )
    assert build_parser().parse_args([command, *THREADED[command], "--threads", str(cpus)]).threads == cpus
    assert build_parser().parse_args([command, *THREADED[command], "--threads", "1"]).threads == 1


@pytest.mark.parametrize(
    "argv, message",
    [
        (["generate", "--ctx", "-1"], "--ctx must be >= 0, got -1"),
        (["chat", "--ctx", "-5"], "--ctx must be >= 0, got -5"),
        (["generate", "-n", "-2"], "-n must be >= -1, got -2"),
        (["generate", "--temp", "-0.5"], "--temp must be a finite number >= 0, got -0.5"),
        (["generate", "--temp", "nan"], "--temp must be a finite number >= 0, got nan"),
        (["generate", "--seed", "-2"], "--seed must be in [-1, 4294967295], got -2"),
        (["chat", "--seed", str(1 << 32)], f"--seed must be in [-1, 4294967295], got {1 << 32}"),
        (
            ["generate", "--device-threads", "0"],
            "--device-threads must be in [1, {cpus}], got 0 ({cpus} CPUs available to this process)",
        ),
        (["perplexity", "--text", "t", "--offset-bytes", "-1"], "--offset-bytes must be >= 0, got -1"),
        (["perplexity", "--text", "t", "--ctx", "0"], "--ctx must be >= 1, got 0"),
        (["calibrate", "--text", "t", "--offset-bytes", "-3"], "--offset-bytes must be >= 0, got -3"),
        (["train-predictor", "--text", "t", "--rank", "0"], "--rank must be >= 1, got 0"),
        (["calibrate", "--text", "t", "--max-ppl-increase", "-1"], "--max-ppl-increase must be in (0, 10), got -1"),
        (["calibrate", "--text", "t", "--target-sparsity", "1"], "--target-sparsity must be in (0, 1), got 1"),
        (
            ["train-predictor", "--text", "t", "--max-ppl-increase", "nan"],
            "--max-ppl-increase must be in (0, 10), got nan",
        ),
        (["bench", "--n-decode", "0"], "--n-decode must be >= 1, got 0"),
        (["bench", "--runs", "0"], "--runs must be >= 1, got 0"),
        (["bench", "--busy", "-1"], "--busy must be >= 0, got -1"),
        (["plan", "--vram-budget", "1GiB", "--batch", "0"], "--batch must be >= 1, got 0"),
        (["plan", "--vram-budget", "1GiB", "--n-past", "-1"], "--n-past must be >= 0, got -1"),
        (
            ["plan", "--vram-budget", "1GiB", "--device-bandwidth", "0"],
            "--device-bandwidth must be a finite number > 0, got 0",
        ),
        (["plan", "--vram-budget", "1GiB", "--sync-us", "-1"], "--sync-us must be a finite number >= 0, got -1"),
        (["serve", "--ctx-size", "-1"], "--ctx-size must be >= 0, got -1"),
        (["serve", "-b", "0"], "--batch-size must be >= 1, got 0"),
    ],
)
def test_sizes_and_counts_are_checked(argv, message, capsys):
    assert _usage_error(capsys, argv).endswith(message.format(cpus=available_cpus()))


def test_limits_that_mean_something_are_accepted():
    a = build_parser().parse_args(["generate", "--ctx", "0", "-n", "-1", "--temp", "0", "--seed", "-1"])
    assert (a.ctx, a.n, a.temp, a.seed) == (0, -1, 0.0, -1)  # the model's context, until the end, greedy, random
    assert build_parser().parse_args(["serve", "--ctx-size", "0"]).ctx_size == 0


def test_bench_refuses_a_thread_count_the_engines_would_not_share(model_path):
    """0 / -1 made each engine fall back to its own default count (1.52x decode 'speedup')."""
    from powerinfer_backend.cli.bench import run_bench

    for bad in (0, -4, 2.0, True):
        with pytest.raises(ValueError, match="n_threads must be an integer >= 1"):
            run_bench(model_path, n_threads=bad, n_decode=1, n_prefill=1, repeats=1)


def _helps(parser: argparse.ArgumentParser):
    yield "powerinfer-backend", parser.format_help()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, p in sub.choices.items():
        yield name, p.format_help()


def test_help_shows_no_rest_markup_and_the_default_prompt():
    helps = dict(_helps(build_parser()))
    assert len(helps) == 10
    assert [name for name, text in helps.items() if "``" in text] == []
    assert "generate streams text" in " ".join(helps["powerinfer-backend"].split())
    assert "(with --chat: the user's message; default 'Once upon a time')" in " ".join(helps["generate"].split())


def test_serve_seed_defaults_to_a_random_one():
    """`serve --seed`'s help said "default random" while every start seeded the model with
    the same value (llama-cpp-python's chain from LLAMA_DEFAULT_SEED)."""
    from powerinfer_backend.server.arg_types import RANDOM_SEED, resolve_seed

    a = build_parser().parse_args(["serve"])
    assert a.seed is None
    drawn = {resolve_seed(s) for s in (None, None, -1, RANDOM_SEED)}
    assert len(drawn) == 4 and all(0 <= s < RANDOM_SEED for s in drawn)
    assert resolve_seed(7) == 7 and resolve_seed(0) == 0
    assert build_parser().parse_args(["serve", "--seed", "12"]).seed == 12
