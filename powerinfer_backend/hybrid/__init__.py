"""The ``hybrid`` layer (above ``sparsity``): PowerInfer's hybrid CPU/device split under
``vram_budget`` (docs/placement.md).

Owns placement (``placement``: exact device bytes, dense blocks then hot neurons, the plan
cache, budget parsing, the plot), the decision from ``vram_budget`` / ``n_gpu_layers`` /
``device`` to a placed context (``offload``) and the devices (``devices``)."""
