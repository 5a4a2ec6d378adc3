# streaming_etl: build, test, demo and benchmark entry points.
# `make` (= `make release`) builds build/release/streaming_etl.duckdb_extension.

EXT        := streaming_etl
VERSION    := $(shell sed -n 's/^version = "\(.*\)"/v\1/p' Cargo.toml | head -1)
ARCH       := $(shell uname -m)
PLATFORM   ?= linux_$(if $(filter x86_64,$(ARCH)),amd64,$(if $(filter aarch64 arm64,$(ARCH)),arm64,$(ARCH)))
VENV       := .venv
PY         := $(VENV)/bin/python
CARGO      ?= cargo
# Hosts the tests load the extension into (PyPI packages).
DUCKDB_PY  ?= 2.0.1
DUCKDB_OLD ?= 1.5.6
DUCKDB_CLI ?= 1.5.6

.PHONY: all release debug tools venv test unit sqltest pytest demo demo-kafka bench reliability clean fmt lint

all: release

release:
	$(CARGO) build --release --lib
	@mkdir -p build/release
	python3 scripts/append_footer.py target/release/lib$(EXT).so build/release/$(EXT).duckdb_extension $(PLATFORM) $(VERSION)

debug:
	$(CARGO) build --lib
	@mkdir -p build/debug
	python3 scripts/append_footer.py target/debug/lib$(EXT).so build/debug/$(EXT).duckdb_extension $(PLATFORM) $(VERSION)

# The test broker (librdkafka's mock cluster with fault injection).
tools:
	$(CARGO) build --release -p mock-kafka

# A local virtualenv with the DuckDB hosts: the Python package (current and previous
# release) and the CLI.
venv: $(VENV)/.ready

$(VENV)/.ready:
	python3 -m venv $(VENV)
	$(PY) -m pip install -q "duckdb==$(DUCKDB_PY)" "duckdb-cli==$(DUCKDB_CLI)" pytest confluent-kafka
	python3 -m venv $(VENV)/old
	$(VENV)/old/bin/python -m pip install -q "duckdb==$(DUCKDB_OLD)" pytest
	touch $@

unit:
	$(CARGO) test --release --lib

sqltest: release venv
	$(PY) test/sqllogictest.py build/release/$(EXT).duckdb_extension test/sql
	$(VENV)/old/bin/python test/sqllogictest.py build/release/$(EXT).duckdb_extension test/sql

pytest: release tools venv
	$(PY) -m pytest -q test/python

test: unit sqltest pytest

demo: release venv
	$(PY) scripts/demo.py

demo-kafka: release tools venv
	$(PY) scripts/demo_kafka.py

reliability: release tools venv
	$(PY) scripts/reliability.py

bench: release tools venv
	$(CARGO) build --release --example engine_bench
	$(PY) scripts/bench.py

fmt:
	$(CARGO) fmt

lint:
	$(CARGO) fmt --check
	$(CARGO) clippy --all-targets -- -D warnings

clean:
	rm -rf build target
