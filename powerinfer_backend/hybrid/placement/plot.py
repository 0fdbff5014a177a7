"""The plan as a picture (``powerinfer-backend plan --plot``): :func:`write_plot`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from .plan import Plan
from .sizes import GiB, MiB

__all__ = ["write_plot"]

#: PNG text written into our plots, so a later run may replace them and nothing else
_PLOT_MARK = "powerinfer-backend plan"


def _human(n: int) -> str:
    return f"{n / GiB:.3f} GiB" if n >= GiB else f"{n / MiB:.3f} MiB"


def _layer_rows(plan: Plan) -> Sequence[tuple[int, float, float]]:
    return [(L.layer, L.n_hot / plan.n_ff, L.freq_mass) for L in plan.layers]


def write_plot(plan: Plan, path: str | os.PathLike, *, force: bool = False) -> Path:
    """PNG with two panels: hot fraction (and frequency mass) per layer, and device
    bytes by category. Needs matplotlib (``pip install matplotlib``). An existing file
    is replaced only when it is one of these plots (or ``force``).

    Raises:
        ImportError: matplotlib is not installed.
        ValueError: ``path`` holds another file and not ``force``.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ...loader.artifacts import atomic_write

    rows = _layer_rows(plan)
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [3, 2]})
    xs = [r[0] for r in rows]
    a.bar(xs, [r[1] for r in rows], color="tab:blue", label="hot neurons / n_ff")
    a.plot(xs, [r[2] for r in rows], "o-", color="tab:orange", label="firing-frequency mass on device")
    a.set_xlabel("layer")
    a.set_ylim(0, 1.05)
    a.set_title("FFN neurons on the device")
    a.legend(loc="upper right", fontsize=8)
    a.xaxis.get_major_locator().set_params(integer=True)
    cats = plan.bytes_by_category()
    names = list(cats)
    b.barh(names, [cats[k] / MiB for k in names], color="tab:green")
    b.set_xlabel("MiB")
    b.set_title(f"budget {_human(plan.budget_bytes)}, used {_human(plan.device_bytes)}")
    fig.tight_layout()
    out = Path(path)
    if out.exists() and not force and _PLOT_MARK.encode() not in out.read_bytes()[:4096]:
        plt.close(fig)
        raise ValueError(
            f"Refusing to overwrite {out}: it is not a plot written by powerinfer-backend plan "
            f"(pass --force / force=True to replace it)"
        )
    atomic_write(out, lambda f: fig.savefig(f, format="png", dpi=100, metadata={"Software": _PLOT_MARK}))
    plt.close(fig)
    return out
