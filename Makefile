# Two entry points: `make train` and `make test`. Both create .venv when it is missing and
# install torch first (the CPU build on this machine), so nothing else pulls a CUDA build.
# GPU users: make train TORCH_SPEC="torch==2.13.0" with their CUDA index in PIP_INDEX_URL / PIP_EXTRA_INDEX_URL.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
ARGS ?=
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
export WANDB_MODE ?= offline
# DeepSpeed compiles its CPU collective op on first use (2 minutes on 2 cores); its build files
# name the venv, so checkouts sharing ~/.cache/torch_extensions rebuilt it for each other
export TORCH_EXTENSIONS_DIR ?= $(abspath $(VENV))/torch_extensions

BIN := $(VENV)/bin
STAMP := $(VENV)/.stackwise-installed

.PHONY: setup train test lint structure docs bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[dev]"
	# the DeepSpeed extra (tests/test_deepspeed.py): its build must see the torch above
	$(BIN)/python -m pip install -q --no-build-isolation "deepspeed>=0.19,<0.20"
	# Chromium for the report's browser test (tests/test_report.py skips, saying why, without it)
	command -v chromium >/dev/null || [ "$$(id -u)" != 0 ] || apt-get install -y -q chromium \
		>/dev/null 2>&1 || (apt-get update -q && apt-get install -y -q chromium) >/dev/null 2>&1 \
		|| echo "Chromium could not be installed: the report's browser test will be skipped"
	touch $(STAMP)

setup: $(STAMP)

train: $(STAMP)
	$(BIN)/stackwise train $(ARGS)

# compileall first: an editable install leaves our sources without bytecode, and where
# PYTHONDONTWRITEBYTECODE is set each of the suite's hundreds of processes would compile every
# module it imports (about 0.25 s a process)
test: $(STAMP)
	$(BIN)/python -m compileall -q stackwise tests
	$(BIN)/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder tests; rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected"; exit 0; fi; exit $$rc

lint: $(STAMP)
	$(BIN)/ruff check stackwise tests benchmarks tools
	$(BIN)/ruff format --check stackwise tests benchmarks tools
	$(BIN)/python tools/structure.py

structure: $(STAMP)
	$(BIN)/python tools/structure.py

# docs/reference/config.md and cli.md, generated from the config models and the CLI parser
docs: $(STAMP)
	$(BIN)/python tools/gen_reference.py

bench: $(STAMP)
	$(BIN)/python benchmarks/throughput.py

clean:
	rm -rf $(VENV) outputs .pytest_cache
