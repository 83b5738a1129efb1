# Holdfast: `make run` starts everything on the embedded default; `make test` runs the suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Where settings look for the SQLite files, STATIC_ROOT and the generated secret key.
VAR_DIR := $(or $(HOLDFAST_VAR_DIR),var)

.PHONY: setup run migrate test test-crash lint format bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

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
run: migrate
	$(BIN)/python manage.py seeddemo
	@# Metrics files of the processes of an earlier start (prometheus multiprocess mode).
	rm -rf $(VAR_DIR)/prometheus
	$(BIN)/honcho start -f Procfile

test: setup
	$(BIN)/python -m pytest

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: setup
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: migrate
	$(BIN)/python benchmarks/step_overhead.py
	$(BIN)/python benchmarks/recovery.py

clean:
	rm -rf $(VENV) var
