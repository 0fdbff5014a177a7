"""Tests of the C kernels through the raw cffi binding (``powerinfer_backend._native``):
the pi_op_* operators on every instruction-set path, against numpy and llama.cpp."""
