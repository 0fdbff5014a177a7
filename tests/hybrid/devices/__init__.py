"""Tests of ``powerinfer_backend.hybrid.devices``: the cpu-device, the CUDA device
(build, glue against a mock library, kernels on a GPU) and uploading a plan."""
