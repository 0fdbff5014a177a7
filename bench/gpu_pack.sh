#!/usr/bin/env bash
# Fills .gpu/ (ignored by git) with what bench/gpu_run.sh needs on a GPU machine that has
# nvcc, cmake, ninja and a Python with numpy/pyyaml/tqdm/pluggy/jinja2 (a PyTorch image) but
# no network and nothing of ours (docs/building.md, "The GPU validation in one call"):
#   .gpu/llama_cpp_python.tar.xz  the sdist of the llama-cpp-python installed here (so the
#                                 llama.cpp it vendors), pruned to what a library build reads
#   .gpu/wheels/                  the Python packages such an image lacks, for its Python
#   .gpu/python-version           that Python's version (gpu_run.sh checks it)
#
#   bash bench/gpu_pack.sh [--python-version 3.12]     # 3.12: the lent H200 machine's Python
#
# Run it where pip reaches the package index; about 30 s and ~3.5 MiB.
set -euo pipefail
cd "$(dirname "$0")/.."
pyver=3.12
while [ $# -gt 0 ]; do
    case "$1" in
        --python-version) pyver="${2:?gpu_pack: --python-version needs a value such as 3.12}"; shift 2 ;;
        *) echo "gpu_pack: unknown argument $1 (takes --python-version X.Y)" >&2; exit 2 ;;
    esac
done
py="${PYTHON:-python}"
out=.gpu
ver=$("$py" -c 'import importlib.metadata as m; print(m.version("llama-cpp-python"))')
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$py" -m pip download -q --no-deps --no-binary=llama-cpp-python -d "$tmp" "llama-cpp-python==$ver"
tar -xzf "$tmp/llama_cpp_python-$ver.tar.gz" -C "$tmp"
src="$tmp/llama_cpp_python-$ver"
v="$src/vendor/llama.cpp"
# A shared-library build (LLAVA_BUILD=OFF, no tools/tests/examples) reads CMakeLists, cmake/,
# common/, include/, src/, vendor/ (json, httplib, miniaudio) and ggml/ with its CPU and CUDA backends.
rm -rf "$src"/{.git,.github,docs,examples,tests,scripts,docker} "$v"/{app,benches,ci,conversion,docs,examples,gguf-py,grammars} \
    "$v"/{media,models,pocs,requirements,scripts,skills,tests,tools} "$v"/.git "$v"/convert_*.py
for b in "$v"/ggml/src/ggml-*/; do
    case "$(basename "$b")" in ggml-cpu | ggml-cuda) ;; *) rm -rf "$b" ;; esac
done
rm -rf "$out"
mkdir -p "$out/wheels"
tar -C "$tmp" -cJf "$out/llama_cpp_python.tar.xz" "llama_cpp_python-$ver"

# What the image lacks: cffi/pycparser (our C library's binding), gguf, diskcache (llama_cpp
# imports it), scikit-build-core (llama-cpp-python's build backend, for a build without
# isolation) with pathspec; numpy, pyyaml, tqdm, pluggy, jinja2, packaging are there.
old=()  # what scikit-build-core needs before Python 3.11
case "$pyver" in 3.8 | 3.9 | 3.10) old=(tomli exceptiongroup) ;; esac
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" --implementation cp "${plat[@]}" \
    -d "$out/wheels" cffi pycparser "gguf>=0.19" diskcache "scikit-build-core>=0.9.2" pathspec "${old[@]}"
echo "$pyver" > "$out/python-version"
echo "gpu_pack: llama-cpp-python $ver, Python $pyver wheels: $(du -sh "$out" | cut -f1) in $out/"
ls -l "$out" "$out/wheels"
