"""``bench --roofline``: how close each engine runs to the host's limits.

Decode of one token reads every weight a dense forward pass uses once (the memory
roof: read bandwidth / bytes per token); prefill is bound by the cores' int8
multiply-add rate (the compute roof: int8 peak / operations per token). Both roofs are
measured in the same run through the engine's worker pool (:mod:`engine.roofline`), and
the bytes come from the plan of what the forward pass reads (:func:`decode_reads`),
checked tensor by tensor against the file's directory.
"""

from __future__ import annotations


def decode_reads(model_path: str) -> dict:
    """What one dense decode step reads from the weights, in bytes, from the slots the
    forward pass uses (every layer's tensors, the output norm and head — the token
    embedding when tied —, rope_freqs, and one row each of the token embedding and of
    learned positions). A tensor filling two slots (Falcon 7B's one norm) counts once.
    The KV cache is not included (it grows with the position; ``kv_bytes_per_position``).

    Returns a dict: ``bytes_per_token`` (as the engine holds the tensors),
    ``file_bytes_per_token`` (the same tensors as stored in the file; differs only for
    tensors converted or rebuilt at load, counted in ``converted_tensors``), ``layer_bytes``,
    ``output_bytes``, ``embedding_row_bytes``, ``n_tensors``, ``matmul_macs_per_token``
    (multiply-adds of the layers' weight matrices), ``head_macs`` (the output head's,
    once per evaluated row that gives logits), ``kv_bytes_per_position`` (F16 K and V
    of all layers).

    Raises:
        ValueError: the file cannot be loaded (as :func:`loader.load_gguf`).
        RuntimeError: a planned tensor's bytes differ from its file entry although it
            is a view of the file (a loader or plan bug).
    """
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    from ..hybrid.placement.sizes import row_bytes
    from ..loader import load_gguf
    from ..loader.arch import KIND_MATRIX
    from ..loader.gguf_meta import parse_header

    model = load_gguf(model_path, verbose=False)
    hp = model.hparams
    entries = {e.name: e for e in parse_header(model.path, pwri=model.pwri).tensors}
    seen: set[str] = set()
    totals = {"engine": 0, "file": 0}
    n_conv = 0

    def read(t, one_row: bool = False) -> int:
        """Count all of ``t`` once (or one row of it, each time); returns the bytes counted."""
        nonlocal n_conv
        if t is None or (not one_row and t.name in seen):
            return 0
        n_rows = 1 if one_row else _rows(t.ne)
        planned = row_bytes(t.type, t.ne[0]) * n_rows
        if t.converted_from is None:  # a view of the file: its directory entry must agree
            entry = entries[t.name]
            stored = row_bytes(entry.type, entry.ne[0]) * n_rows
            if planned != stored or (not one_row and planned != entry.nbytes):
                raise RuntimeError(f"{t.name}: the plan reads {planned} bytes, the file holds {stored}")
        else:  # converted or rebuilt at load (e.g. ffn_down from PowerInfer's ffn_down_t): the file's type
            block, size = GGML_QUANT_SIZES[GGMLQuantizationType(t.converted_from)]
            stored = t.ne[0] * n_rows // block * size
        if not one_row:
            seen.add(t.name)
            n_conv += t.converted_from is not None
        totals["engine"] += planned
        totals["file"] += stored
        return planned

    layer_bytes = 0
    macs = 0
    for i in range(hp.n_layer):
        for spec, t in zip(model.spec.layer_tensors, model.layer_tensors(i)):
            layer_bytes += read(t)
            if t is not None and spec.kind == KIND_MATRIX:  # a weight matrix: multiply-adds for every token
                macs += t.ne[0] * _rows(t.ne)
    g = model.global_tensors()
    head = g["output"] if g["output"] is not None else g["tok_embd"]
    assert head is not None  # the loader requires tok_embd
    output_bytes = sum(read(g[s]) for s in ("output_norm", "output_norm_b", "rope_freqs")) + read(head)
    # one row of the embedding (a different read from the tied head's: it comes first in the step)
    emb_row = read(g["tok_embd"], one_row=True) + read(g["pos_embd"], one_row=True)
    return {
        "bytes_per_token": totals["engine"],
        "file_bytes_per_token": totals["file"],
        "layer_bytes": layer_bytes,
        "output_bytes": output_bytes,
        "embedding_row_bytes": emb_row,
        "n_tensors": len(seen),
        "converted_tensors": n_conv,
        "matmul_macs_per_token": macs,
        "head_macs": head.ne[0] * _rows(head.ne),
        "kv_bytes_per_position": 2 * 2 * hp.n_layer * hp.n_head_kv * hp.n_embd_head,
    }


def _rows(ne) -> int:
    n = 1
    for x in ne[1:]:
        n *= int(x)
    return n


def measure_roofs(
    n_threads: int,
    *,
    bandwidth_mib: int = 1024,
    bandwidth_repeats: int = 5,
    peak_iters: int = 2_000_000,
    peak_repeats: int = 3,
) -> dict:
    """The host's read bandwidth (bytes/s, best pass over ``bandwidth_mib`` MiB) and int8
    multiply-add peak (ops/s) for ``n_threads`` threads, and the microkernels' ISA path.

    Raises:
        ValueError: a size or count out of range (see :mod:`engine.roofline`).
    """
    from ..engine.roofline import int8_peak, microkernel_isa, read_bandwidth

    return {
        "threads": n_threads,
        "isa": microkernel_isa(),
        "bandwidth_mib": bandwidth_mib,
        "read_bytes_per_s": read_bandwidth(n_threads, bandwidth_mib << 20, bandwidth_repeats),
        "int8_ops_per_s": int8_peak(n_threads, peak_iters, peak_repeats),
    }


def roofline(bench: dict, reads: dict, roofs: dict) -> dict:
    """The roofline section of a bench result: the roofs, the bytes and operations per
    token, and per engine of ``bench`` (``ours``, ``ours_sparse``, ``llama_cpp``) its
    decode and prefill tok/s as a percentage of the roofs. Decode's roof is
    ``read_bytes_per_s / bytes_per_token``; prefill's is ``int8_ops_per_s`` over the
    operations of a prompt of ``n_prefill`` tokens per token (2 per multiply-add of the
    layers' weight matrices for every token, and of the head once; attention's
    position-dependent work is not counted). The sparse engine reads fewer bytes than a
    dense step: its percentage is against the dense roof."""
    n_prefill = bench["n_prefill"]
    prefill_ops = 2.0 * (reads["matmul_macs_per_token"] + reads["head_macs"] / n_prefill)
    decode_roof = roofs["read_bytes_per_s"] / reads["bytes_per_token"]
    prefill_roof = roofs["int8_ops_per_s"] / prefill_ops
    out = {
        **roofs,
        **reads,
        "prefill_ops_per_token": prefill_ops,
        "decode_roof_tok_s": decode_roof,
        "prefill_roof_tok_s": prefill_roof,
    }
    for key in ("ours", "ours_sparse", "llama_cpp"):
        if key in bench:
            e = bench[key]
            out[key] = {
                "decode_pct_of_roof": 100.0 * e["decode_tok_s"] / decode_roof,
                "prefill_pct_of_roof": 100.0 * e["prefill_tok_s"] / prefill_roof,
            }
    return out


def format_roofline(r: dict) -> str:
    """Human-readable lines for the section :func:`add_roofline` puts into a bench result."""
    lines = [
        f"roofline ({r['threads']} threads, {r['isa']} microkernels, load average {r['loadavg_1m']:.2f}):",
        f"  read bandwidth {r['read_bytes_per_s'] / 1e9:.1f} GB/s (best pass over {r['bandwidth_mib']} MiB); "
        f"{r['bytes_per_token'] / 1e6:.1f} MB read per decoded token -> decode roof "
        f"{r['decode_roof_tok_s']:.1f} tok/s",
        f"  int8 multiply-add peak {r['int8_ops_per_s'] / 1e9:.1f} Gop/s; "
        f"{r['prefill_ops_per_token'] / 1e6:.1f} Mop per prompt token -> prefill roof "
        f"{r['prefill_roof_tok_s']:.1f} tok/s",
    ]
    names = {"ours": "ours (dense)", "ours_sparse": "ours (sparse; vs the dense roof)", "llama_cpp": "llama.cpp"}
    for key, name in names.items():
        if key in r:
            lines.append(
                f"  {name:<34} decode {r[key]['decode_pct_of_roof']:5.1f}% of roof, "
                f"prefill {r[key]['prefill_pct_of_roof']:5.1f}% of roof"
            )
    return "\n".join(lines)


def add_roofline(result: dict, model_path: str, *, n_threads: int, bandwidth_mib: int = 1024) -> dict:
    """Measure the roofs now and put :func:`roofline`'s section into a ``run_bench``
    result as ``result["roofline"]`` (with the 1-minute load average); returns it."""
    import os

    section = roofline(result, decode_reads(model_path), measure_roofs(n_threads, bandwidth_mib=bandwidth_mib))
    section["loadavg_1m"] = os.getloadavg()[0]
    result["roofline"] = section
    return section
