# oipgen: `make build` sets up .venv and generates the package; `make test` runs the whole suite.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: build test goldens lint bench-build bench bench-scale bench-client serve conformance-matrix clean

# oipgen with its dev tools, and every part's run-time requirements from their one source (REQUIREMENTS in
# oipgen/targets/__init__.py), so the suite can run the generated package here.
$(STAMP): pyproject.toml oipgen/targets/__init__.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	$(BIN)/python -c 'from oipgen.targets import TARGETS, requirements; print(*requirements(list(TARGETS)), sep="\n")' \
		> $(VENV)/runtime-requirements.txt
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r $(VENV)/runtime-requirements.txt
	touch $(STAMP)

## build: create the virtual environment, install oipgen and generate every target into generated/
build: $(STAMP)
	$(BIN)/oipgen build --target all

## test: the whole suite (goldens, determinism, vendoring, codecs, converters, interop)
test: $(STAMP)
	$(BIN)/python -m pytest

## goldens: refresh the committed output in generated/ after a change to spec/, templates/ or oipgen/, and the
##   goldens of the extra specs (tests/specs/*.diff: what each variant of the spec generates differently)
goldens: $(STAMP)
	$(BIN)/oipgen build --target all
	$(BIN)/python tests/specs/variants.py

## lint: ruff over oipgen (runtime included), the tests and bench; mypy strict over oipgen and over a fresh build of
##   the package (where the runtime modules are type-checked with the generated code they import)
lint: $(STAMP)
	$(BIN)/ruff check oipgen tests bench
	$(BIN)/mypy
	$(BIN)/python tests/typecheck.py

## serve: build, then serve the example models (examples/models: every model of spec/examples/models.yaml, so
##   `python -m oip.conformance` reports 0 failed against it) over REST on :8000 and gRPC on :8001
serve: build
	PYTHONPATH=generated $(BIN)/python -m oip serve --model-repository examples/models --host 127.0.0.1 --http-port 8000 --grpc-port 8001

## bench-build: time a cold build and a --check against the floor (datamodel-codegen + protoc)
bench-build: $(STAMP)
	$(BIN)/python bench/build_speed.py

## bench-client: the generated client's encode + decode per request beside tritonclient's (1M FP32 over REST JSON,
##   REST binary and gRPC raw, and the small `simple` request), no server; prints a table with ratios
##   (BENCH_CLIENT_ARGS="--cpu 2 --json out.json": pinned, figures saved)
bench-client: $(STAMP)
	$(BIN)/python bench/client_speed.py $(BENCH_CLIENT_ARGS)

## bench: ours against Triton 2.51, MLServer 1.7.1 and KServe 0.21.0 (set up under bench/.cache by bench/setup.sh),
##   with bench/loadgen.py and perf_analyzer, same load and logging, pinned CPUs; ratios against Triton first;
##   writes bench/results/results.{md,json} and bench.png (BENCH_ARGS=--quick: a smoke run)
bench: $(STAMP)
	$(BIN)/python bench/run.py $(BENCH_ARGS)

## bench-scale: our latency and CPU per inference from 1 KB to 64 MB and from 1 to 64 concurrent requests;
##   writes bench/results/scale.{md,json,png}
bench-scale: $(STAMP)
	$(BIN)/python bench/scale.py $(BENCH_ARGS)

## conformance-matrix: both layers of `python -m oip.conformance` against Triton 2.51, MLServer 1.7.1, KServe 0.21.0
##   and ours, each serving the example models in its own native form (the peers set up under bench/.cache by
##   bench/setup.sh); writes docs/conformance-matrix.{md,json,png} (CONFORMANCE_ARGS="--servers oipgen,triton")
conformance-matrix: build
	BENCH_SETUP_ONLY=peers bash bench/setup.sh
	BENCH_SETUP_ONLY=triton bash bench/setup.sh
	$(BIN)/python bench/conformance_matrix.py $(CONFORMANCE_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
