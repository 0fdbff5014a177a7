"""The calibration's budget search (sparsity/search.py) on synthetic perplexity curves:
it finds the sparsest point within the goal in few evaluations and only ever returns a
point it measured within the goal."""

from __future__ import annotations

import numpy as np
import pytest

from powerinfer_backend.sparsity.search import search_budget

MEANS = np.linspace(0.0, 0.8, 481)  # a path's mean sparsity per row, as calibration builds them


@pytest.mark.parametrize("scale,power", [(0.015, 6), (0.015, 3), (0.002, 5), (0.05, 8), (0.004, 3), (0.2, 2)])
def test_finds_the_boundary_within_tolerance(scale, power):
    def inc(i):  # increase = scale * (mean / 0.3) ** power, plus measurement noise
        seen.append(i)
        return scale * (MEANS[i] / 0.3) ** power + np.random.default_rng(i).normal(0, 5e-4)

    seen = []
    i, evals = search_budget(MEANS, inc, 0.015, tol=0.01)
    searched = list(seen)
    truth = MEANS[[j for j in range(1, len(MEANS)) if inc(j) <= 0.015][-1]]
    assert evals == len(searched) <= 7 and 0 not in searched
    assert i in searched and inc(i) <= 0.015  # a measured point within the goal
    assert truth - 0.02 <= MEANS[i] <= truth + 1e-9, (MEANS[i], truth)


def test_whole_path_within_and_nothing_within():
    i, evals = search_budget(MEANS, lambda i: 1e-4 * MEANS[i], 0.015)
    assert i == len(MEANS) - 1 and evals <= 4
    i, evals = search_budget(MEANS, lambda i: 1.0, 0.015, max_evals=8)
    assert i == 0 and evals <= 8  # dense: no measured point was within the goal


def test_known_rows_bound_the_search_without_evaluations():
    """Rows measured before (another path's check) are not measured again: one within the
    goal is a floor of the answer, one over it a ceiling."""

    def inc(i):
        seen.append(i)
        return 0.015 * (MEANS[i] / 0.3) ** 4

    truth = MEANS[[j for j in range(1, len(MEANS)) if 0.015 * (MEANS[j] / 0.3) ** 4 <= 0.015][-1]]
    seen: list[int] = []
    j = int(np.searchsorted(MEANS, 0.25))
    i, evals = search_budget(MEANS, inc, 0.015, tol=0.01, known={j: inc(j)})
    assert seen[0] == j and j not in seen[1:] and evals == len(seen) - 1
    assert all(s > j for s in seen[1:]) and truth - 0.01 <= MEANS[i] <= truth
    seen = []
    k = int(np.searchsorted(MEANS, 0.35))
    i, _ = search_budget(MEANS, inc, 0.015, tol=0.01, known={k: inc(k)})
    assert k not in seen[1:] and all(s < k for s in seen[1:]) and MEANS[i] <= truth
