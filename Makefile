# The two commands in the README's quick start: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run install uninstall check test llama-server screenshots bench mutation mutation-all clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Stamps: reinstall when pyproject.toml changes.
# A path-based editable install and compiled bytecode keep the quick CLI's start-up short.
EDITABLE := --config-settings editable_mode=compat --editable

$(VENV)/.runtime: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet $(EDITABLE) .
	$(BIN)/python -m compileall -q app
	touch $@

$(VENV)/.test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet $(EDITABLE) '.[test]'
	$(BIN)/python -m compileall -q app
	touch $@ $(VENV)/.runtime

# The real board where there is an NVIDIA driver; elsewhere the simulated fleet and a demo database.
run: $(VENV)/.runtime
	$(BIN)/board $$( [ -e /proc/driver/nvidia/version ] || echo --demo )

# `board` on your PATH: a link in ~/.local/bin (USER_BIN) to this checkout's .venv/bin/board. It never replaces a
# `board` that is not that link; `make uninstall` removes the link and nothing else.
USER_BIN ?= $(HOME)/.local/bin
LINK := $(USER_BIN)/board
OURS := $(CURDIR)/$(BIN)/board

install: $(VENV)/.runtime
	@if { [ -e "$(LINK)" ] || [ -L "$(LINK)" ]; } && [ "$$(readlink "$(LINK)")" != "$(OURS)" ]; then \
		echo "$(LINK) exists and is not a link to $(OURS); move it away first" >&2; exit 1; fi
	mkdir -p "$(USER_BIN)"
	ln -sfn "$(OURS)" "$(LINK)"
	@echo "board is $(LINK) -> $(OURS); undo with: make uninstall"
	@case ":$$PATH:" in *":$(USER_BIN):"*) ;; \
		*) echo "$(USER_BIN) is not on your PATH: add  export PATH=\"$(USER_BIN):\$$PATH\"  to ~/.bashrc";; esac

uninstall:
	@if [ "$$(readlink "$(LINK)")" = "$(OURS)" ]; then rm "$(LINK)" && echo "removed $(LINK)"; \
	else echo "$(LINK) is not a link to $(OURS); left alone"; fi

# Builds llama-server from source once (about 7 minutes on 2 cores), cached in ~/.cache/board.
llama-server:
	@scripts/build_llama_server.sh

# The developer's loop (under 3 minutes): lint, the type checker against its baseline (scripts/typecheck.py), the rules,
# the in-process service and the compact TUI snapshots.
QUICK_TIERS := not real_users and not llama_server and not prometheus and not slow and not postgresql
check: $(VENV)/.test
	$(BIN)/ruff check .
	$(BIN)/python scripts/typecheck.py
	$(BIN)/python -m pytest -q -n auto -m "$(QUICK_TIERS)" tests/unit tests/service/test_behaviour.py \
		tests/tui/test_tui_snapshots.py -k "not 120x40"

# The whole suite: what is safe in parallel first (pytest-xdist), then the `serial` tests one at a time. More workers
# than cores: most tests wait on processes and sockets. Lint and the type checker first (seconds); a failed llama-server
# build, Prometheus download or PostgreSQL install (the `postgresql` tier's throwaway clusters) stops here rather than
# letting tests skip; zsh (the completion tests) is installed where make test runs as root.
WORKERS ?= 4
test: $(VENV)/.test
	$(BIN)/ruff check .
	$(BIN)/python scripts/typecheck.py
	scripts/install_postgresql.sh >/dev/null && scripts/install_zsh.sh && \
	server="$$(scripts/build_llama_server.sh)" && prometheus="$$(scripts/fetch_prometheus.sh)" && \
	export BOARD_LLAMA_SERVER="$$server" BOARD_PROMETHEUS_DIR="$$prometheus" || exit; \
	$(BIN)/python -m pytest -n $(WORKERS) --dist loadgroup -m "not serial"; parallel=$$?; \
	$(BIN)/python -m pytest -m serial && exit $$parallel

$(VENV)/.mutation: pyproject.toml | $(VENV)/.test
	$(BIN)/python -m pip install --quiet $(EDITABLE) '.[test,mutation]'
	touch $@

# Mutation testing of the rules (pyproject's [tool.mutmut]). `make mutation` mutates only the modules whose text
# differs from tests/mutation-record.json (`make mutation MODULES='app/fit/*'`: the ones named), and keeps mutants/
# between runs so that mutmut's map of which tests reach which function is only brought up to date (new tests,
# changed functions), not rebuilt: about 35 minutes saved. A module unchanged since a run that did not end clean
# (stopped, or failed on survivors) runs only its mutants not caught yet: add the tests, run `make mutation` again.
# A test rewritten under its old name can leave that map stale (a test not run on a mutant it now reaches, a time
# limit from its old duration): `make mutation-all` starts from scratch and runs every module (about 2.5 hours on
# 2 cores; see tests/MUTANTS.md). Prints the score per module and any survivor not in tests/MUTANTS.md; when there
# is none, records the modules in tests/mutation-record.json (commit it). Without MODULES it then runs the
# PostgreSQL store's locking and the heartbeat's PostgreSQL side against the `postgresql` tier
# (scripts/mutation_locks.py: as root, in mutants-locks/ and mutants-pg-hosts/).
MUTMUT_CHILDREN ?= $$(nproc)
# Each mutmut run has a temp dir of its own (TMPDIR), removed when the run ends, stopped or not. A session removes its
# own pytest folder (tests/conftest.py), but one that mutmut kills (a timeout: SIGXCPU; Ctrl-C: SIGKILL) leaves it,
# locked against pytest's clean-up for 3 days, with the folders its fixtures made with tempfile.
# 0755, as /tmp lets others through: tests that run a process as another user give it a folder made with tempfile.
IN_OWN_TMP = tmp="$$(mktemp -d /tmp/board-mutation.XXXXXX)" && trap 'rm -rf "$$tmp"' EXIT && trap 'exit 130' INT TERM HUP \
	&& chmod 755 "$$tmp" && export TMPDIR="$$tmp" &&
mutation mutation-all: $(VENV)/.mutation
	$(if $(filter mutation-all,$@),rm -rf mutants)
	$(IN_OWN_TMP) names="$$($(BIN)/python scripts/mutation_report.py --select $(if $(filter mutation-all,$@),--all) $(MODULES))" && \
	set -f && if [ -n "$$names" ]; then $(BIN)/mutmut run --max-children $(MUTMUT_CHILDREN) $$names; fi
	$(BIN)/python scripts/mutation_report.py
	$(if $(MODULES),,$(IN_OWN_TMP) $(BIN)/python scripts/mutation_locks.py --max-children $(MUTMUT_CHILDREN) \
		$(if $(filter mutation-all,$@),--all))

screenshots: $(VENV)/.test
	$(BIN)/python scripts/make_screenshots.py

# About 4 minutes. As root: through a throwaway agent run as the unit runs it (users alice, bob, board).
bench: $(VENV)/.test
	$(BIN)/python bench/bench_cli.py
	$(BIN)/python bench/bench_tui.py --seconds 45
	if [ "$$(id -u)" = 0 ]; then $(BIN)/python bench/bench_service.py && $(BIN)/python bench/bench_load.py; \
	else echo "bench_service.py and bench_load.py need root (sudo make bench)"; fi

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis mutants mutants-locks mutants-pg-hosts
