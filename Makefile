# `make demo` and `make test` create .venv and install attnkit into it when needed.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test install clean

install: $(STAMP)

# Reinstall whenever the dependency list changes.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[dev,backbones]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/attnkit demo

test: $(STAMP)
	$(BIN)/python -m pytest

clean:
	rm -rf runs/demo .pytest_cache
