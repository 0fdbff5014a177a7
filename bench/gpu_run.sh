#!/usr/bin/env bash
# The GPU validation in one call, on a machine with an NVIDIA GPU, nvcc, cmake, ninja, a C
# compiler and a Python with numpy/pyyaml/tqdm/pluggy/jinja2 (cuBLAS from the CUDA toolkit or
# from the nvidia-cublas wheel a PyTorch install brings), but no network and nothing of ours
# installed. It needs .gpu/ made beforehand by bench/gpu_pack.sh (carried with the checkout):
#   1. installs .gpu/wheels into a private folder ($PI_GPU_SITE, default /tmp/pi-site);
#   2. builds the llama.cpp that the pinned llama-cpp-python vendors (.gpu's pruned sdist) with
#      GGML_CUDA=on for this GPU's architecture and installs llama_cpp (Python files and its
#      lib/ folder, where engine/ggml.py binds ggml) into that folder;
#   3. builds our C library in place and runs bench/gpu_validate.py, JSON and log to $OUT.
#
#   bash bench/gpu_run.sh [gpu_validate.py arguments]     # default: --device cuda
#   PI_GPU_BACKEND=cpu bash bench/gpu_run.sh --device ggml-cpu --small   # the rehearsal, no GPU
#   PI_GPU_CUDA_OBJECTS=3 bash bench/gpu_run.sh   # configure with CUDA, compile 3 ggml-cuda files, stop
#   PI_GPU_FLASH_ATTN=ON bash bench/gpu_run.sh    # also compile ggml-cuda's flash attention (+~3 min)
#   PI_GPU_AGAIN="--quant Q4_K_M" bash bench/gpu_run.sh  # then validate once more with these
#       arguments added (models already made are reused), if under PI_GPU_AGAIN_BY s (default 420) have passed
#
# gpu_validate.py's arguments are checked first (before minutes of build). Exit status:
# gpu_validate.py's (0 every check passed, 1 one failed, 2 no device or bad arguments), else
# 5 .gpu/ missing or packed for another Python, 3 the llama.cpp build failed, 4 ours failed.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
carry="${PI_GPU_CARRY:-$root/.gpu}"
backend="${PI_GPU_BACKEND:-cuda}"
site="${PI_GPU_SITE:-/tmp/pi-site}"
out="${OUT:-$root/gpu-out}"  # ignored by git
py="${PYTHON:-python3}"
jobs=$(nproc)
# -h / --help: this header and gpu_validate.py's options (no .gpu/ needed)
case " $* " in *" -h "* | *" --help "*) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; "$py" bench/gpu_validate.py --help; exit 0 ;; esac
mkdir -p "$out"
exec > >(tee -a "$out/gpu_run.log") 2>&1
t0=$SECONDS
say() { echo "gpu_run: [$((SECONDS - t0)) s, load $(cut -d' ' -f1 /proc/loadavg)] $*"; }

[ -f "$carry/llama_cpp_python.tar.xz" ] || { echo "gpu_run: $carry/llama_cpp_python.tar.xz missing: run bench/gpu_pack.sh here first and carry .gpu" >&2; exit 5; }
want=$(cat "$carry/python-version" 2>/dev/null || echo "?")
have=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[ "$want" = "$have" ] || { echo "gpu_run: $carry was packed for Python $want, $py is $have: bash bench/gpu_pack.sh --python-version $have" >&2; exit 5; }
say "$($py --version), $jobs cores, backend $backend"
"$py" bench/gpu_validate.py "$@" --check-args || exit 2  # a usage error now, not after the build

# 1. the Python packages the image lacks (into $site, emptied first), our checkout, on the path
rm -rf "$site"
"$py" -m pip install -q --no-index --no-deps --no-compile --target "$site" "$carry"/wheels/*.whl
export PYTHONPATH="$site:$root${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

# 2. llama.cpp as llama-cpp-python builds it, plus CUDA
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tar -C "$tmp" -xJf "$carry/llama_cpp_python.tar.xz" || { echo "gpu_run: $carry/llama_cpp_python.tar.xz is unreadable: pack it again" >&2; exit 5; }
src=$(echo "$tmp"/llama_cpp_python-*)
cmake_args=(-DLLAVA_BUILD=OFF -DGGML_CCACHE=OFF)
libdirs=""
if [ "$backend" = cuda ]; then
    # cuBLAS: the toolkit's headers, else the nvidia-cublas wheel's (PyTorch's site-packages)
    cuda_home="${CUDA_HOME:-$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")}"
    if [ -f "$cuda_home/include/cublas_v2.h" ]; then
        say "cuBLAS from the toolkit at $cuda_home"
    else
        hdr=$("$py" - <<'EOF'
import glob, site, sys
roots = site.getsitepackages() + [site.getusersitepackages()] + sys.path
hits = [h for r in roots for h in glob.glob(f"{r}/nvidia/*/include/cublas_v2.h") + glob.glob(f"{r}/nvidia/cublas/include/cublas_v2.h")]
print(hits[0] if hits else "")
EOF
)
        [ -n "$hdr" ] || { echo "gpu_run: no cublas_v2.h in $cuda_home/include nor in an nvidia-cublas wheel of $py" >&2; exit 2; }
        inc=$(dirname "$hdr")
        lib=$(dirname "$inc")/lib
        say "cuBLAS from the wheel at $(dirname "$inc")"
        cmake_args+=("-DCMAKE_CUDA_FLAGS=-I$inc" "-DCMAKE_CXX_FLAGS=-I$inc"
                     "-DCUDA_cublas_LIBRARY=$(ls "$lib"/libcublas.so* | head -1)"
                     "-DCUDA_cublasLt_LIBRARY=$(ls "$lib"/libcublasLt.so* | head -1)")
        libdirs="$lib"
    fi
    # the driver library ggml-cuda links for its virtual-memory pool: the toolkit's stub, else
    # the driver's own file, else the pool goes (GGML_CUDA_NO_VMM: plain cudaMalloc pools)
    if ! ls "$cuda_home"/lib64/stubs/libcuda.so "$cuda_home"/targets/*/lib/stubs/libcuda.so >/dev/null 2>&1; then
        drv=$(ldconfig -p 2>/dev/null | grep -o '/[^ ]*/libcuda\.so[.0-9]*$' | head -1 || true)
        if [ -n "$drv" ]; then cmake_args+=("-DCUDA_cuda_driver_LIBRARY=$drv"); else cmake_args+=(-DGGML_CUDA_NO_VMM=ON); fi
        say "driver library: ${drv:-none found, GGML_CUDA_NO_VMM=ON}"
    fi
    arch="${PI_CUDA_ARCH:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d . || true)}"
    arch="${arch:-90}"
    # flash-attention kernels (37 of ggml-cuda's 144 files, ~40% of its compile time) only on
    # request: without them the build fits in the call; our device and llama.cpp then both
    # attend with mul_mat + soft_max (the device's probe sees FA unsupported)
    # --exclude-libs: what static archives bring into libggml-cuda stays private to it (on the
    # lent H200 image llama.cpp's tokenizer regex crashed in a libstdc++ symbol libggml-cuda exported)
    cmake_args+=(-DGGML_CUDA=on "-DCMAKE_CUDA_ARCHITECTURES=${arch}-real" -DGGML_CUDA_NCCL=OFF
                 "-DGGML_CUDA_FA=${PI_GPU_FLASH_ATTN:-OFF}" "-DCMAKE_SHARED_LINKER_FLAGS=-Wl,--exclude-libs,ALL")
    say "CUDA architecture sm_$arch, nvcc $(nvcc --version | grep -o 'release [0-9.]*')"
fi

if [ -n "${PI_GPU_CUDA_OBJECTS:-}" ]; then  # rehearsal: configure as below, compile a few CUDA files
    bdir="$tmp/build"
    cmake -S "$src" -B "$bdir" -G Ninja -DCMAKE_BUILD_TYPE=Release "${cmake_args[@]}" > "$out/cmake_configure.log"
    mapfile -t objs < <(ninja -C "$bdir" -t targets all | grep -o '^[^:]*ggml-cuda[^:]*\.cu\.o' | head -n "$PI_GPU_CUDA_OBJECTS")
    say "configured; compiling ${objs[*]##*/}"
    nice ninja -C "$bdir" "${objs[@]}"
    say "compiled ${#objs[@]} of $(ninja -C "$bdir" -t targets all | grep -c 'ggml-cuda[^:]*\.cu\.o') ggml-cuda objects"
    exit 0
fi

say "building llama.cpp (${cmake_args[*]})"
CMAKE_ARGS="${cmake_args[*]}" CMAKE_BUILD_PARALLEL_LEVEL=$jobs \
    "$py" -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target "$site" "$src" \
    > "$out/llama_build.log" 2>&1 || { tail -40 "$out/llama_build.log"; say "llama.cpp build failed"; exit 3; }
say "llama.cpp built: $(ls "$site"/llama_cpp/lib | tr '\n' ' ')"
export LD_LIBRARY_PATH="$site/llama_cpp/lib${libdirs:+:$libdirs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# 3. our C library, then the validation
"$py" setup.py -q build_ext --inplace -j "$jobs" > "$out/ext_build.log" 2>&1 || { tail -40 "$out/ext_build.log"; exit 4; }
"$py" -m powerinfer_backend.cli devices || true
[ $# -gt 0 ] || set -- --device cuda
say "bench/gpu_validate.py $*"
rc=0
"$py" bench/gpu_validate.py "$@" --out "$out/gpu_validate.json" || rc=$?
say "done, gpu_validate.py exit status $rc"
if [ -n "${PI_GPU_AGAIN:-}" ]; then
    if [ $((SECONDS - t0)) -lt "${PI_GPU_AGAIN_BY:-420}" ]; then
        say "again: bench/gpu_validate.py $* $PI_GPU_AGAIN"
        # shellcheck disable=SC2086  # PI_GPU_AGAIN is a list of arguments
        "$py" bench/gpu_validate.py "$@" $PI_GPU_AGAIN --out "$out/gpu_validate_again.json" || rc=$((rc > 0 ? rc : $?))
        say "done again, exit status $rc"
    else
        say "no time for again ($PI_GPU_AGAIN)"
    fi
fi
exit $rc
