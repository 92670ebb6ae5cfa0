# oipgen: `make build` sets up .venv and generates the package; `make test` runs the whole suite.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
UV = $(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python
SITE ?= site

.PHONY: help build test goldens lint docs dist bench-build bench bench-scale bench-client serve conformance-matrix clean
.DEFAULT_GOAL := help

# oipgen with its dev tools, every part's run-time requirements from their one source (REQUIREMENTS in
# oipgen/targets/__init__.py), and the generated distribution in generated/ as an editable install by path, so
# the venv's python imports `oip` from generated/ (what `make build` writes) with no PYTHONPATH.
# pip installs uv, and uv the rest (the same packages pip would choose, in a fraction of the time), compiled to
# bytecode as pip does: nothing then compiles the libraries again in every process that imports them.
$(STAMP): pyproject.toml oipgen/targets/__init__.py generated/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check 'uv>=0.5'
	$(UV) -e '.[dev]'
	$(BIN)/python -c 'from oipgen.targets import TARGETS, requirements; print(*requirements(list(TARGETS)), sep="\n")' \
		> $(VENV)/runtime-requirements.txt
	$(UV) -r $(VENV)/runtime-requirements.txt
	$(UV) --no-deps -e ./generated
	touch $(STAMP)

## help: list the targets with what each does (the first line of its description)
help:
	@awk '/^## [a-z][a-z-]*: / { name = substr($$2, 1, length($$2) - 1); sub(/^## [a-z-]*: /, ""); \
		printf "  make %-13s %s\n", name, $$0 }' $(firstword $(MAKEFILE_LIST))

## build: create the virtual environment, install oipgen and generate every target into generated/
build: $(STAMP)
	$(BIN)/oipgen build --target all

## test: the whole suite (goldens, determinism, vendoring, codecs, converters, interop)
##   (TEST_JOBS processes, each running whole files; TEST_JOBS=0 runs it in this one)
TEST_JOBS ?= 2
test: $(STAMP)
	$(BIN)/python -m pytest -n $(TEST_JOBS)

## goldens: refresh the committed generated/ and tests/specs/*.diff after a change to spec/, templates/ or oipgen/
##   (tests/specs/*.diff: the goldens of the extra specs, what each variant of the spec generates differently)
goldens: $(STAMP)
	$(BIN)/oipgen build --target all
	$(BIN)/python tests/specs/variants.py

## lint: ruff, mypy --strict over oipgen, and mypy --strict over a fresh build of the package
##   (ruff over oipgen, runtime included, the tests and bench; the runtime modules are type-checked in the fresh
##   build, with the generated code they import)
lint: $(STAMP)
	$(BIN)/ruff check oipgen tests bench
	$(BIN)/mypy
	$(BIN)/python tests/typecheck.py

## serve: build, then serve the example models (examples/models) over REST on :8000 and gRPC on :8001
##   (every model of spec/examples/models.yaml, so `python -m oip.conformance` reports 0 failed against it)
##   (SERVE_ARGS="--http-port 0 --grpc-port 0 --ports-file F": other flags, added after these)
serve: build
	$(BIN)/python -m oip serve --model-repository examples/models --host 127.0.0.1 --http-port 8000 --grpc-port 8001 \
		$(SERVE_ARGS)

## docs: build the documentation site (mkdocs.yml, docs/) into site/ with --strict: a broken link fails
docs: $(STAMP)
	$(BIN)/mkdocs build --strict --site-dir $(SITE)

## dist: build oipgen's wheel into dist/ (install it anywhere: pip install dist/oipgen-*.whl)
dist: $(STAMP)
	rm -rf dist
	$(BIN)/python -m pip wheel --quiet --disable-pip-version-check --no-deps --no-build-isolation --wheel-dir dist .

## bench-build: time a cold build and a --check against the floor (datamodel-codegen + protoc)
bench-build: $(STAMP)
	$(BIN)/python bench/build_speed.py

## bench-client: the generated client's encode + decode time per request beside tritonclient's, no server
##   (1M FP32 over REST JSON, REST binary and gRPC raw, and the small `simple` request); prints a table with ratios
##   (BENCH_CLIENT_ARGS="--cpu 2 --json out.json": pinned, figures saved)
bench-client: $(STAMP)
	$(BIN)/python bench/client_speed.py $(BENCH_CLIENT_ARGS)

## bench: our server against Triton 2.51, MLServer 1.7.1 and KServe 0.21.0; writes bench/results/
##   (servers set up under bench/.cache by bench/setup.sh; bench/loadgen.py and perf_analyzer, same load and
##   logging, pinned CPUs; ratios against Triton first; results.{md,json} and bench.png. BENCH_ARGS=--quick: a
##   smoke run, written to bench/.work/quick/ so that the committed figures stay those of a full run)
bench: $(STAMP)
	$(BIN)/python bench/run.py $(BENCH_ARGS)

## bench-scale: our latency and CPU per inference from 1 KB to 64 MB and from 1 to 64 concurrent requests
##   (writes bench/results/scale.{md,json,png})
bench-scale: $(STAMP)
	$(BIN)/python bench/scale.py $(BENCH_ARGS)

## conformance-matrix: the conformance suite against Triton, MLServer, KServe and ours; writes docs/conformance-matrix.*
##   (both layers of `python -m oip.conformance` against Triton 2.51, MLServer 1.7.1, KServe 0.21.0 and ours, each
##   serving the example models in its own native form; the peers are set up under bench/.cache by bench/setup.sh);
##   writes docs/conformance-matrix.{md,json,png} (CONFORMANCE_ARGS="--servers oipgen,triton")
conformance-matrix: build
	BENCH_SETUP_ONLY=peers bash bench/setup.sh
	BENCH_SETUP_ONLY=triton bash bench/setup.sh
	$(BIN)/python bench/conformance_matrix.py $(CONFORMANCE_ARGS)

## clean: remove the virtual environment, the tools' caches, the wheel (dist/) and the site (site/)
clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache dist site
