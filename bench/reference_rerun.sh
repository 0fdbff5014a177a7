#!/bin/sh
# The benchmark set of docs/benchmarks.md against llama.cpp at its defaults, for a quiet host:
# each model's `bench --roofline` three times (medians of 3 in the docs), then one busy
# process beside both engines, then the 7B-shaped files. JSON per run into $OUT, with the
# 1-minute load average at the start of each (the roofline section records it at the end).
#
#   sh bench/reference_rerun.sh OUT_DIR MODEL.gguf [MODEL.gguf ...]
#
# e.g. the models of issue 23: SmolLM2 (the default), Gemma 3 270M Q4_K_M, Qwen2.5-Coder-0.5B and
# -1.5B-Instruct Q4_K_M (assembled as shared/README.md says).
set -eu
OUT=$1; shift
mkdir -p "$OUT"
run() {  # name, command...
    name=$1; shift
    echo "$(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg): $name" >&2
    "$@" > "$OUT/$name.json"
}
for i in 1 2 3; do
    for m in "$@"; do
        run "$(basename "$m" .gguf)-bench-$i" powerinfer-backend bench --model "$m" --threads 2 --roofline --json
    done
done
for m in "$@"; do
    run "$(basename "$m" .gguf)-busy1" powerinfer-backend bench --model "$m" --busy 1 --threads 2 --json
done
run mem7b python bench/mem7b.py --runs 3 --threads 2 --json
