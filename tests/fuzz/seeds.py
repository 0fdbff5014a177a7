"""The fuzz seeds: valid tiny GGUFs written with the test fixtures' writers (each tensor type
family the kernels run, each architecture), and the real SmolLM2 file, whose header region
alone is mutated (its 98 MB of tensor data are appended unchanged)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from gguf import GGMLQuantizationType as T

from tests.fixtures.tiny_archs import write_tiny_falcon, write_tiny_gemma3, write_tiny_opt, write_tiny_qwen2
from tests.fixtures.tiny_gguf import write_tiny_llama

from .gguf_layout import Layout, parse
from .mutate import Mutator

_KQUANTS = {
    "token_embd": T.Q4_K,
    "attn_q": T.Q5_K,
    "attn_k": T.Q6_K,
    "attn_v": T.Q4_K,
    "attn_output": T.Q5_K,
    "ffn_gate": T.Q4_K,
    "ffn_up": T.Q5_K,
    "ffn_down": T.Q6_K,
    "output": T.Q6_K,
}
_MIXED = {
    "token_embd": T.F16,
    "attn_q": T.Q4_0,
    "attn_k": T.Q4_1,
    "attn_v": T.Q5_0,
    "attn_output": T.BF16,
    "ffn_gate": T.F32,
    "ffn_up": T.Q4_0,
    "ffn_down": T.Q5_0,
    "output": T.BF16,
}

#: seed name -> writer(path): tiny files, a few tens of KB each
TINY_SEEDS = {
    "llama_q8_0": lambda p: write_tiny_llama(p, n_layer=1),
    "llama_kquants_rope_freqs_untied": lambda p: write_tiny_llama(
        p, n_embd=256, n_ff=256, n_layer=1, types=_KQUANTS, rope_freqs=True, tied=False
    ),
    "llama_mixed_f16_q4_0_q4_1_q5_0_bf16_f32": lambda p: write_tiny_llama(
        p, n_layer=1, types=_MIXED, tied=False, extra_kv={"general.alignment": 32}
    ),
    "gemma3_q8_0": lambda p: write_tiny_gemma3(p, n_layer=2, n_swa=2, matrix_type=T.Q8_0),
    "qwen2_q8_0": lambda p: write_tiny_qwen2(p, n_layer=1),
    "falcon_f16": lambda p: write_tiny_falcon(p, n_layer=1, matrix_type=T.F16),
    "opt_f32": lambda p: write_tiny_opt(p, n_layer=1),
}


@dataclass
class Seed:
    """A seed: its name, the bytes mutated (``region``), the unmutated tail appended to
    every mutant (``tail_path`` from ``tail_offset``: the real model's tensor data; None
    for tiny seeds, mutated whole) and the :class:`Mutator`."""

    name: str
    region: bytes
    layout: Layout
    mutator: Mutator
    tail_path: str | None = None
    tail_offset: int = 0


def tiny_seeds(folder: str | os.PathLike) -> list[Seed]:
    """Write :data:`TINY_SEEDS` into ``folder`` and parse them."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    out = []
    for name, write in TINY_SEEDS.items():
        path = Path(folder) / f"seed_{name}.gguf"
        write(str(path))
        for left in Path(folder).glob(f"seed_{name}.gguf.*"):  # the arch writers' intermediate files
            left.unlink()
        buf = path.read_bytes()
        lay = parse(buf)
        out.append(Seed(name, buf, lay, Mutator(buf, lay)))
    return out


def real_seed(path: str | os.PathLike) -> Seed:
    """The real model's header region (magic to the first tensor byte) as a seed."""
    path = os.fspath(path)
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(16 << 20)  # the header of a 49k-token vocabulary is ~2 MB
    lay = parse(head)
    region = head[: lay.data_start]
    return Seed(
        Path(path).stem,
        region,
        lay,
        Mutator(region, lay, file_size=size, header_only=True),
        tail_path=path,
        tail_offset=lay.data_start,
    )


def write_mutant(seed: Seed, data: bytes, path: str) -> None:
    """Write a mutant (``data``: the mutated region) to ``path``, with the seed's tail."""
    with open(path, "wb") as out:
        out.write(data)
        if seed.tail_path is not None:
            with open(seed.tail_path, "rb") as src:
                size = os.fstat(src.fileno()).st_size
                off, left = seed.tail_offset, size - seed.tail_offset
                while left > 0:
                    n = os.copy_file_range(src.fileno(), out.fileno(), left, off)
                    if n <= 0:
                        break
                    off += n
                    left -= n
