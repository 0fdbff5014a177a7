"""Tests of ``powerinfer_backend.hybrid.devices``: device names over the devices ggml
reports, and an open device's byte rule."""
