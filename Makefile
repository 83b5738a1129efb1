# Holdfast: `make run` starts everything on the embedded default; `make test` runs the suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Where settings look for the SQLite files, STATIC_ROOT and the generated secret key.
VAR_DIR := $(or $(HOLDFAST_VAR_DIR),var)

.PHONY: setup run migrate test test-crash lint format bench clean lock lock-check

# Dependencies install from the locks in requirements/, which `make lock` writes from
# pyproject.toml with uv: every package, transitive ones included, at one version with the
# hashes of its files, so pip refuses anything else. Two locks, in a directory of their
# own: base.txt is what a deployment installs (README, Running in production), dev.txt adds
# the dev extra (tests, ruff, uv itself). The project goes in after them, editable and
# without dependencies: it has no published file to hash. pip is pinned too, since the
# venv's own is whichever the machine's Python came with.
PIP_VERSION := 26.3
LOCK_BASE := requirements/base.txt
LOCK_DEV := requirements/dev.txt
# --universal: one lock for every platform and Python from 3.11 (markers pick the rest).
# uv keeps the versions already in the output file that still fit, so a lock changes only
# where pyproject.toml did, or where LOCK_ARGS asks (--upgrade-package NAME, --upgrade).
UV_COMPILE = $(CURDIR)/$(BIN)/uv pip compile pyproject.toml --quiet --universal \
	--python-version 3.11 --generate-hashes --custom-compile-command 'make lock' $(LOCK_ARGS)
# The locks of the pyproject.toml in directory $(1), into $(1)/requirements/: dev.txt is held
# to base.txt's versions, so the suite tests what a deployment runs.
# base.txt carries the pydantic-ai extra: the agents a deployment registers by default include
# support.pydantic_agent, the refund agent's Pydantic AI twin (README, Pydantic AI agents).
define compile_locks
	cd $(1) && $(UV_COMPILE) --extra pydantic-ai -o $(LOCK_BASE)
	cd $(1) && $(UV_COMPILE) --extra dev -c $(LOCK_BASE) -o $(LOCK_DEV)
endef

$(STAMP): pyproject.toml $(LOCK_BASE) $(LOCK_DEV)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet pip==$(PIP_VERSION)
	$(BIN)/python -m pip install --quiet --require-hashes -r $(LOCK_DEV)
	$(BIN)/python -m pip install --quiet --no-deps -e .
	touch $(STAMP)

# Any uv the venv has will do, so a lock that no longer installs can still be rewritten.
lock:
	test -x $(BIN)/uv || $(MAKE) $(STAMP)
	$(call compile_locks,.)

# CI: the committed locks are what `make lock` makes of pyproject.toml now, so a dependency
# changed there without a new lock fails. It compiles copies of them beside a link to
# pyproject.toml, so uv starts from the same pins and the files name the same paths.
LOCK_CHECK := $(VENV)/lock-check
lock-check: $(STAMP)
	rm -rf $(LOCK_CHECK) && mkdir -p $(LOCK_CHECK)/requirements
	cp $(LOCK_BASE) $(LOCK_DEV) $(LOCK_CHECK)/requirements/
	ln -s $(CURDIR)/pyproject.toml $(LOCK_CHECK)/pyproject.toml
	$(call compile_locks,$(LOCK_CHECK))
	diff -u $(LOCK_BASE) $(LOCK_CHECK)/$(LOCK_BASE) && diff -u $(LOCK_DEV) $(LOCK_CHECK)/$(LOCK_DEV) \
	  || { echo 'the locks in requirements/ are out of date: run make lock' >&2; exit 1; }

# The embedded default's secret key, generated once so sessions and signed tasks
# survive restarts (DJANGO_SECRET_KEY or DJANGO_SECRET_KEY_FILE wins when set).
# Written aside and moved into place, so an interrupted make leaves no half key behind.
$(VAR_DIR)/secret_key:
	mkdir -p $(VAR_DIR)
	umask 077 && $(PYTHON) -c 'import secrets; print(secrets.token_urlsafe(50))' > $@.draft
	mv $@.draft $@

# Settings only read var/: the directories and the key are made here.
setup: $(STAMP) $(VAR_DIR)/secret_key
	mkdir -p $(VAR_DIR)/static

migrate: setup
	$(BIN)/python manage.py migrate --noinput
	@if [ -z "$$DATABASE_URL" ]; then $(BIN)/python manage.py migrate --noinput --database queue; fi
	$(BIN)/python manage.py migrate --noinput --database sandbox

# The local demo, on http://127.0.0.1:8000 only (Procfile): plain HTTP (no HTTPS
# redirect, no Secure cookies), and the published demo password for seeddemo's logins,
# given explicitly, since seeddemo refuses it with DEBUG off. Each can be overridden.
run: export HOLDFAST_SSL_REDIRECT ?= false
run: export HOLDFAST_SECURE_COOKIES ?= false
run: export HOLDFAST_DEMO_PASSWORD ?= holdfast-demo
# The sandbox's webhook receiver (http://127.0.0.1:12111/hooks/<channel>) is local.
run: export HOLDFAST_WEBHOOK_ALLOW_PRIVATE ?= true
run: migrate
	$(BIN)/python manage.py seeddemo
	@# Metrics files of the processes of an earlier start (prometheus multiprocess mode).
	rm -rf $(VAR_DIR)/prometheus
	$(BIN)/honcho start -f Procfile

# The suite spends much of its time waiting on the processes it starts and kills (worker
# clusters, live servers, Chromium), so it runs in TEST_PROCESSES processes (pytest-xdist),
# a module to a process at a time: a module's fixtures (a live server, a browser) start once.
# The tests that restart the PostgreSQL or Redis server run after it, alone: a restart
# would cut the connections of whatever ran beside them.
TEST_PROCESSES ?= 2
test: setup
	$(BIN)/python -m pytest -n $(TEST_PROCESSES) --dist loadscope -m "not restarts_servers"
	$(BIN)/python -m pytest -m restarts_servers

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: setup
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: migrate
	$(BIN)/python benchmarks/step_overhead.py
	$(BIN)/python benchmarks/recovery.py
	$(BIN)/python benchmarks/snapshot.py
	$(BIN)/python benchmarks/broker_pickup.py

clean:
	rm -rf $(VENV) var
