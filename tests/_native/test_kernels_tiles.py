"""The tiled kernels of prefill and batched decode (several weight rows x several tokens
per step, isa/x86_tiles.h and scalar.c; Q4_0, Q4_1, Q5_0, Q8_0 and the K-quants)
against the row dot of decode: a batch of
tokens must give every token the same float bits as that token alone (pi_op_matmul with
one token runs the row dot), on every instruction-set path this CPU has, for shapes
whose rows, tokens and n_cols are not multiples of the tile (rows x tokens: scalar 1 x 4,
AVX2 1 x 8, AVX-512 2 x 8; a pool thread's rows come in runs of 16). The AVX kernels
also read each token's block scales (and Q4_0 / Q5_0 offset sums, Q8_K chunk sums) from
the side arrays pi_matmul_multi lays out beside the activation rows, so a wrong entry
there shows up here as a differing token. An ISA this CPU lacks is skipped."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT
from gguf import quants

from powerinfer_backend import _native

from tests._native.test_kernels_kquants import activations, native_matmul, weights
from tests.fixtures.ggml import ggml_base

ffi, lib = _native.ffi, _native.lib

TYPES = ("Q4_0", "Q4_1", "Q8_0", "Q5_0", "Q4_K", "Q5_K", "Q6_K")
BLOCK32 = ("Q4_0", "Q4_1", "Q8_0", "Q5_0")  # blocks of 32, scales d (and Q4_1's m) as F16
# (n_rows, n_cols, n_tok): n_cols in super-blocks of 256 (K-quants) or blocks of 32; the
# 32-block shapes add 4 tokens (serve --parallel 4) and 17 (two full AVX tiles and one)
# and SmolLM2's n_embd, 576. Every token count below a full tile of 8 has its own AVX
# kernel: together the shapes end on 1 to 7 tokens after the full tiles.
SHAPES = {
    "K": [(1, 256, 2), (5, 768, 3), (37, 512, 9), (18, 1280, 6), (3, 256, 15)],
    "32": [(1, 32, 2), (7, 96, 5), (37, 640, 9), (18, 288, 4), (20, 576, 17), (3, 64, 7), (2, 96, 14)],
}


def block32_weights(tname: str, n_rows: int, n_cols: int, real: bool) -> np.ndarray:
    """Quantized bytes (n_rows, row bytes): real = gguf's quantizer on Gaussian weights
    with outliers; else random quants (every nibble, Q8_0's -128) with small finite F16
    scales, Q4_1's m of either sign."""
    t = GT[tname]
    rng = np.random.default_rng(n_rows * 7919 + n_cols * 31 + int(t) * 2 + real)
    if real:
        w = (rng.standard_normal((n_rows, n_cols)) * 0.05).astype(np.float32)
        w[:, ::29] *= 6
        return quants.quantize(w, t)
    block, tsize = quants.GGML_QUANT_SIZES[t]
    b = rng.integers(0, 256, size=(n_rows, n_cols // block, tsize), dtype=np.uint8)
    b[..., 0:2] = rng.uniform(0.002, 0.01, size=b.shape[:2]).astype("<f2")[..., None].view(np.uint8)
    if tname == "Q4_1":
        b[..., 2:4] = rng.uniform(-0.02, 0.02, size=b.shape[:2]).astype("<f2")[..., None].view(np.uint8)
    return b.reshape(n_rows, -1)


@pytest.fixture(params=["scalar", "avx2", "avx512", "avx512vnni"])
def each_isa(request):
    if request.param not in _native.supported_isas():
        pytest.skip(f"this CPU lacks {request.param}")
    _native.set_isa(request.param)
    try:
        yield request.param
    finally:
        _native.set_isa("auto")


@pytest.mark.parametrize("tname", TYPES)
def test_tiles_bit_identical_to_row_dot(pool, each_isa, tname):
    isa = each_isa
    assert lib.pi_matmul_has_tiles(int(GT[tname])) == 1, f"{isa}: no tiled {tname} kernel"
    for n_rows, n_cols, n_tok in SHAPES["32" if tname in BLOCK32 else "K"]:
        for real in (False, True):
            if tname in BLOCK32:
                wq = block32_weights(tname, n_rows, n_cols, real)
            elif real and ggml_base() is None:
                continue  # real K-quant weights need llama-cpp-python's libggml-base
            else:
                _, wq = weights(tname, n_rows, n_cols, real=real)
            x = activations(n_tok, n_cols, n_rows + 7 * n_tok)
            batch = native_matmul(pool, GT[tname], wq, n_rows, n_cols, x)
            rows = np.concatenate(
                [native_matmul(pool, GT[tname], wq, n_rows, n_cols, x[t : t + 1]) for t in range(n_tok)]
            )
            assert np.isfinite(batch).all()
            bad = np.argwhere(batch.view(np.uint32) != rows.view(np.uint32))
            assert bad.size == 0, (
                f"{isa} {tname} real={real} {n_rows}x{n_cols}x{n_tok}: "
                f"(token, row) {bad[:4].tolist()} differ, max |diff| "
                f"{np.abs(batch - rows).max():.3g}"
            )


def test_no_tiles_for_other_types():
    assert lib.pi_matmul_has_tiles(int(GT.Q8_K)) == 0  # an activation type
    assert lib.pi_matmul_has_tiles(int(GT.F32)) == 0  # no tiled kernel: the row loop
    assert lib.pi_matmul_has_tiles(-1) == 0
