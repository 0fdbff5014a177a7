"""``powerinfer-backend chat`` driven through a terminal (pexpect, a real pty) and
``generate --chat``, on SmolLM2: greedy answers equal ``Llama.create_chat_completion``'s
with the same history, and Ctrl-C mid-answer returns to the prompt with the chat intact."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

from powerinfer_backend import Llama

from tests.fixtures import ROOT

pexpect = pytest.importorskip("pexpect")

ARGS = ["--temp", "0", "--threads", "2", "--ctx", "512"]
_ANSI = re.compile(r"\x1b\[[0-9;?]*[a-zA-Z]")  # readline's terminal controls, if any


@pytest.fixture(scope="module")
def local(model_path):
    """The same model in-process: what the chat must answer."""
    with Llama(model_path, n_ctx=512, n_threads=2, verbose=False) as llm:
        yield llm


def _answer(llm, history, **kw):
    return llm.create_chat_completion(history, temperature=0, **kw)["choices"][0]["message"]["content"]


def _clean(text: str) -> str:
    return _ANSI.sub("", text).replace("\r\n", "\n")


def _ask(child, line: str) -> str:
    """Send one line at the prompt; the answer printed before the next prompt."""
    child.sendline(line)
    child.expect_exact(line + "\r\n")  # the terminal's echo
    child.expect_exact("\r\n> ")
    return _clean(child.before)


def test_chat_in_a_terminal_keeps_history_and_ctrl_c_stops_an_answer(model_path, local):
    env = dict(os.environ, TERM="dumb", PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    child = pexpect.spawn(
        sys.executable,
        ["-m", "powerinfer_backend", "chat", *ARGS, "-n", "0"],
        cwd=str(ROOT),
        env=env,
        encoding="utf-8",
        timeout=240,
        dimensions=(50, 2000),
    )
    try:
        child.expect_exact("> ")
        history = []
        # short answers that end (SmolLM2 answers the France question with a loop that fills
        # the context, llama.cpp too); the second needs the first
        for q in ("What is the capital of Germany?", "And of Italy?"):
            history.append({"role": "user", "content": q})
            got = _ask(child, q)
            want = _answer(local, history)
            assert got == want and want.strip()
            history.append({"role": "assistant", "content": got})
        # Ctrl-C (the terminal's SIGINT) after the first words of a long answer
        q = "Write a very long story about a dragon who learns to paint."
        child.sendline(q)
        child.expect_exact(q + "\r\n")
        child.expect(r"\w+ \w+ \w+")
        first = child.before + child.after
        child.sendintr()
        t0 = time.monotonic()
        child.expect_exact("\r\n> ", timeout=60)
        stopped_in = time.monotonic() - t0
        partial = _clean(first + child.before).replace("^C", "", 1)  # the terminal echoes the interrupt
        history += [{"role": "user", "content": q}, {"role": "assistant", "content": partial}]
        # the chat goes on, the cut answer in its history
        history.append({"role": "user", "content": "What is 2+2?"})
        got = _ask(child, "What is 2+2?")
        child.sendintr()  # Ctrl-C at the prompt: quit
        child.expect(pexpect.EOF, timeout=60)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0
    assert stopped_in < 30
    n = len(local.tokenize(partial.encode(), add_bos=False))
    full = _answer(local, history[:-3] + [{"role": "user", "content": q}], max_tokens=n + 8)
    assert full.startswith(partial) and len(full) > len(partial)  # cut mid-answer, at a token boundary
    assert got == _answer(local, history) and got.strip()


def test_exit_command_and_system_message(local, monkeypatch, capsys):
    import io

    from powerinfer_backend.cli.chat import run_chat

    monkeypatch.setattr(sys, "stdin", io.StringIO("Say hello.\n\n/exit\nWhat is 2+2?\n"))
    out = io.StringIO()
    system = "You are a pirate."
    assert run_chat(local, system=system, out=out, temperature=0, max_tokens=12) == 0
    want = _answer(
        local, [{"role": "system", "content": system}, {"role": "user", "content": "Say hello."}], max_tokens=12
    )
    # input() writes its prompt to stdout when stdin is not a terminal; the answers go to `out`
    assert capsys.readouterr().out == "> > > " and out.getvalue() == want + "\n"


def test_generate_chat_verbose_prints_the_answer_and_llama_cpp_timings(local):
    """One message through the chat template; --verbose: llama.cpp's timing lines; -ngl
    without a device: one warning line (no Python source line)."""
    q = "What is the capital of France?"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "powerinfer_backend",
            "generate",
            "--chat",
            "--prompt",
            q,
            *ARGS,
            "-n",
            "16",
            "--verbose",
            "--device",
            "cpu",
            "-ngl",
            "5",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout == _answer(local, [{"role": "user", "content": q}], max_tokens=16) + "\n"
    err = p.stderr.splitlines()
    assert "powerinfer-backend: warning: n_gpu_layers=5 ignored: device='cpu'; running on the CPU" in err
    assert not [line for line in err if "warn(" in line or "UserWarning" in line]
    perf = {
        m.group(1).strip(): m
        for m in (
            re.match(
                r"llama_perf_context_print: +(\w[\w ]*?) time = +([\d.]+) ms"
                r"(?: / +(\d+) (?:tokens|runs))?(?: .*?([\d.]+) tokens per "
                r"second\))?$",
                line,
            )
            for line in err
        )
        if m
    }
    assert set(perf) == {"load", "prompt eval", "eval", "total"}
    assert float(perf["load"].group(2)) > 0
    n_prompt, n_eval = int(perf["prompt eval"].group(3)), int(perf["eval"].group(3))
    assert n_prompt > len(local.tokenize(q.encode(), add_bos=False)) and 1 <= n_eval <= 16  # the template adds
    assert float(perf["prompt eval"].group(4)) > 0 and float(perf["eval"].group(4)) > 0
    assert int(perf["total"].group(3)) == n_prompt + n_eval


def test_slash_commands_are_answered_by_the_chat_not_the_model(local, monkeypatch, capsys):
    """/help lists the commands, an unknown /command is refused, /clear confirms: none of
    them reaches the model (one /help once ran 2,000 tokens of emoji); -n cutting an answer
    is said."""
    import io

    from powerinfer_backend.cli.chat import COMMANDS, run_chat

    monkeypatch.setattr(sys, "stdin", io.StringIO("/help\n/halp me\n/clear\nSay hello.\n/exit\n"))
    out, err = io.StringIO(), io.StringIO()
    assert run_chat(local, out=out, err=err, temperature=0, max_tokens=4) == 0
    assert out.getvalue() == _answer(local, [{"role": "user", "content": "Say hello."}], max_tokens=4) + "\n"
    lines = err.getvalue().splitlines()
    assert [line.split()[0] for line in lines[: len(COMMANDS)]] == ["/help", "/clear", "/exit"]
    assert lines[len(COMMANDS) + 1 :] == [
        "powerinfer-backend: error: unknown command /halp (/help lists the commands)",
        "history cleared",
        "[stopped: -n 4 tokens]",
    ]
    assert capsys.readouterr().out == "> " * 5


def test_an_answer_the_context_cut_says_so(model_path, monkeypatch):
    import io

    from powerinfer_backend.cli.chat import run_chat

    q = "Write a long story about a dragon."
    monkeypatch.setattr(sys, "stdin", io.StringIO(q + "\n"))
    out, err = io.StringIO(), io.StringIO()
    with Llama(model_path, n_ctx=80, n_threads=2, verbose=False) as small:
        assert run_chat(small, out=out, err=err, temperature=0) == 0
        want = _answer(small, [{"role": "user", "content": q}])
    assert out.getvalue() == want + "\n\n"  # the answer's line, then end of input
    assert err.getvalue() == "[stopped: context full (80 tokens)]\n"
