# The two front-door commands (README): `make run` and `make test`.
# Both create .venv and install what they need; a stamp file skips the install
# when pyproject.toml has not changed.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DATA   ?= ../shared/data
PORT   ?= 8000

.PHONY: venv run demo test test-fast lint results results-node-classification bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first and exactly pinned, so nothing resolves the CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

## The main job: the service on the bundled checkpoint (embedded store unless DYGSERVE_REDIS_URL is set).
run: $(STAMP)
	$(BIN)/dygserve serve --port $(PORT)

## A small end-to-end model demo on UCI (train a tiny model, score, check step/scan parity).
demo: $(STAMP)
	$(BIN)/python -m training.demo --data $(DATA)/uci/edges.csv.gz

## The whole test suite (CI runs exactly this).
test: $(STAMP)
	$(BIN)/python -m pytest -q -ra

## The architecture and the house style (CI runs it before the tests): layer contracts,
## ruff check, ruff format --check, mypy.
lint: $(STAMP)
	$(BIN)/lint-imports
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

## Train and evaluate on the five datasets and rewrite docs/RESULTS.md (long: hours on 2 cores);
## then node classification on the labelled ones (Wikipedia, MOOC), its own section.
## One stream at a time: make results RESULTS_ARGS="--datasets uci". Each stream's summary is
## kept in docs/results/summaries/ (committed), and the document shows every stream run so far;
## --reuse starts from it where runs/ is gone (more seeds: "--datasets uci --seeds 0,1,2 --reuse").
results: $(STAMP)
	$(BIN)/python -m training.results --data $(DATA) --out runs/results --doc docs/RESULTS.md $(RESULTS_ARGS)

## Only the node-classification section of docs/RESULTS.md (heads on runs/results/<name>/full,
## or on the link checkpoints named in NC_ARGS, e.g. NC_ARGS="--nc-base wikipedia=runs/wiki-link";
## several link seeds, every head seed on each: "--nc-base wikipedia=runs/a,runs/b --nc-seeds 0,1,2").
results-node-classification: $(STAMP)
	$(BIN)/python -m training.results --node-classification --data $(DATA) --out runs/results --doc docs/RESULTS.md $(NC_ARGS)

## Benchmarks: store, service load, cached vs recompute; rewrites docs/BENCHMARKS.md.
bench: $(STAMP)
	$(BIN)/dygserve bench all --doc docs/BENCHMARKS.md

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis runs
