# oipgen: `make build` sets up .venv and generates the package; `make test` runs the whole suite.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: build test goldens lint bench-build serve clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

## build: create the virtual environment, install oipgen and generate every target into generated/
build: $(STAMP)
	$(BIN)/oipgen build --target all

## test: the whole suite (goldens, determinism, vendoring, codecs, converters, interop)
test: $(STAMP)
	$(BIN)/python -m pytest

## goldens: refresh the committed output in generated/ after a change to spec/, templates/ or oipgen/
goldens: $(STAMP)
	$(BIN)/oipgen build --target all

## lint: ruff and mypy over oipgen and the tests
lint: $(STAMP)
	$(BIN)/ruff check oipgen tests bench
	$(BIN)/mypy

## serve: build, then serve the example models (examples/models) over REST on :8000 and gRPC on :8001
serve: build
	PYTHONPATH=generated $(BIN)/python -m oip serve --model-repository examples/models --host 127.0.0.1 --http-port 8000 --grpc-port 8001

## bench-build: time a cold build and a --check against the floor (datamodel-codegen + protoc)
bench-build: $(STAMP)
	$(BIN)/python bench/build_speed.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
