"""Tests of the benchmark scripts in bench/ (their checks and messages, not their timings)."""
