"""The GGUF fuzz harness (docs/reliability.md "Fuzzing"): seeds, mutators, the warm
worker and the run; ``python -m tests.fuzz --help`` for the long run."""
