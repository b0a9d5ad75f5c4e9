# Two commands on a fresh machine:  `make run` (set up + run the main job), `make test` (the tests).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
MODEL := models/default/manifest.json
Q4LIB := handler/backends/native/libws_q4.so

.PHONY: setup run test test-fast lint bench bench-quota gpu-check clean

# Two install sets in one venv: `make run` installs what packing the default model and serving the demo need
# (the `demo` extra: the runtime, torch + transformers for the export, the local Lambda); `make test` and
# `make lint` add the dev set (test tools, clients, linters, every other extra). Sizes and times: README.
$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch==2.13.0 is pinned in the extras: an unpinned torch would pull a multi-GB CUDA build.
	$(BIN)/pip install --quiet -e '.[demo]'
	touch $@

$(BIN)/.dev-installed: $(BIN)/.installed
	$(BIN)/pip install --quiet -e '.[dev]'
	# --no-deps: its wheel requires the CPU `onnxruntime`, which would overwrite onnxruntime-gpu's files; it
	# runs on the onnxruntime already installed (the GPU image installs onnxruntime-genai-cuda instead).
	$(BIN)/pip install --quiet --no-deps onnxruntime-genai==0.18.0
	# fastembed, for bench/peers/sparse.py only: --no-deps for the same reason (its other needs: loguru, mmh3,
	# py_rust_stemmers; tokenizers, huggingface-hub and numpy are already there).
	$(BIN)/pip install --quiet --no-deps fastembed==0.9.1 loguru==0.7.3 mmh3==5.3.1 py_rust_stemmers==0.1.8
	touch $@

# The fast path by default: this machine packs and serves, so the model is also saved pre-optimized with
# prepacked weights for its onnxruntime and CPU (`warmstart optimize`; the portable model stays the fallback
# init takes anywhere else, and when the optimized one cannot be proved bit-identical, setup goes on without
# it). Then the init chain's compiled modules in one file (handler/runtime/codebundle.py) and the start's file
# list (handler/runtime/startfiles.py, recorded by startrecord.py) that a cold page cache start prefetches.
$(MODEL): $(BIN)/.installed $(wildcard infra/pack/*.py)
	$(BIN)/warmstart pack --default --force
	$(BIN)/warmstart optimize models/default || echo "make setup: no optimized model; the portable one serves"
	$(BIN)/python -m compileall -q handler
	$(BIN)/python -m handler.runtime.codebundle || echo "make setup: no code bundle; init imports each .pyc"
	$(BIN)/python -m handler.runtime.startrecord || echo "make setup: no start list; prefetch reads whole libraries"

# The int4 MatMul without prepack (handler/backends/q4lib.py): ONNX Runtime's custom op for generate packs' int4
# weights, gcc in ~2 s. Without it (no compiler) the engine opens the MatMulNBits graph: slower to load, same answers.
$(Q4LIB): $(BIN)/.installed $(wildcard handler/backends/native/*.c handler/backends/native/*.h)
	$(BIN)/python -m handler.backends.q4lib build || echo "make setup: no Q4MatMul library; MatMulNBits serves"

setup: $(Q4LIB) $(MODEL)

run: setup
	$(BIN)/warmstart demo

# Everything, as CI runs it (.ci/run): about 20 minutes on a 2-core host (2,172 tests in 16.9 min of pytest, 19.2 min
# for the whole .ci/run on a clean clone, one run).
test: setup $(BIN)/.dev-installed
	@echo "make test: the whole suite, about 20 minutes; make test-fast runs unit + functional"
	$(BIN)/python -m pytest

# While working: the unit and functional tiers only (no real processes, deploy or docs tiers).
test-fast: setup $(BIN)/.dev-installed
	@echo "make test-fast: the unit and functional tiers only; make test runs everything (CI)"
	$(BIN)/python -m pytest tests/unit tests/functional

lint: $(BIN)/.dev-installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# Spawn → first embedding through awslambdaric, no quota, warm page cache (no root needed): warmstart on both backends
# against the hand-written floors, sentence-transformers and the imports-only memory baselines (bench/coldstart/run.py).
bench: setup
	$(BIN)/python bench/coldstart/run.py --quotas none --caches warm --warm-calls 20 --variants ours,ours+sha,floor_ort,minimal_ort,naive_st,ours_torch,floor_torch,imports_only_onnx,imports_only_torch

# CPU quotas x warm/cold page cache (root: cgroup v1 cpu controller, posix_fadvise DONTNEED); "ours" runs an
# optimized copy of the default model (`warmstart optimize`) made under build/bench.
bench-quota: setup
	$(BIN)/python bench/coldstart/run.py

# On a machine with an NVIDIA GPU: init with the CUDA warm-up on both backends, first vs steady inference, float32 vs
# float16, the device re-check after a snapshot restore, as one table (infra/cli/gpu_check.py, beside the other
# tools make runs). Without one: says so, exits 0.
gpu-check: setup
	$(BIN)/python -m infra.cli.gpu_check

clean:
	rm -rf $(VENV) models build dist
