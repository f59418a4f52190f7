# `make test` is the one command that runs the test suite on a fresh machine: it creates the
# virtual environment and installs paravt with its dev extra when they are missing or stale,
# then runs ruff and pytest (everything except `gpu` tests). Re-running it installs nothing.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.paravt-installed
# -qq: pip's warnings (resolver notes, script locations) are not the user's business; errors show.
PIP := $(PY) -m pip -qq --disable-pip-version-check --no-input

.PHONY: test lint install demo

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install --upgrade pip
	$(PIP) install -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

test: lint
	$(PY) -m pytest -q

# The embedded default: PARA-GRPO on CPU with a tiny local Qwen3-VL and synthetic needle videos.
demo: $(STAMP)
	$(PY) train.py
