# Holdfast: `make run` starts everything on the embedded default; `make test` runs the suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup run migrate test test-crash lint format bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

migrate: setup
	$(BIN)/python manage.py migrate --noinput
	@if [ -z "$$DATABASE_URL" ]; then $(BIN)/python manage.py migrate --noinput --database queue; fi
	$(BIN)/python manage.py migrate --noinput --database sandbox

run: migrate
	$(BIN)/python manage.py seeddemo
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
