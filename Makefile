# One command sets everything up and runs the course; one runs the tests.
#   make course   create .venv if missing, install, run every notebook headlessly (fast)
#   make test     same set-up, then the test suite
#   make lab      same set-up, then JupyterLab on notebooks/
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.labkit-installed
COURSE_ARGS ?= --fast
PYTEST_ARGS ?=

.PHONY: setup course test test-quick lab doctor bench lint clean gpu-check image-smoke image-base-local \
	room-test room-smoke room-proxy

setup: $(STAMP)

$(STAMP): requirements.txt requirements-dev.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip setuptools
	$(BIN)/python -m pip install --quiet -r requirements.txt -r requirements-dev.txt
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $@

course: setup
	$(BIN)/labkit course run $(COURSE_ARGS)

test: setup
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test-quick: setup
	$(BIN)/python -m pytest -m "not notebooks and not slow" $(PYTEST_ARGS)

lab: setup
	$(BIN)/jupyter lab notebooks/

# On a GPU machine: GPU tests and the whole course on CUDA, summary in gpu-check/summary.md.
gpu-check:
	bash .ci/gpu-check

# The workshop image (docker/README.md): build it and check it in a container. Needs Docker with
# BuildKit and disk for torch's CUDA libraries; CI does not run these. Settings: docker/smoke-test.sh.
image-smoke:
	bash docker/smoke-test.sh

# A Debian 12 base made with debootstrap, for building where no image registry is reachable.
image-base-local:
	bash docker/local-base.sh

# A workshop room on this machine (tests/room/, docker/room/): N learners on one JupyterHub
# with a local spawner. Several minutes on 2 cores, so not part of `make test`. As root, every
# learner gets a system user and a network namespace, so the room's venv is built on a Python
# that every user can run (/usr/bin/python3 where there is one). LABKIT_ROOM_LEARNERS_N=6 for more.
ROOM := .room
ROOM_PYTHON ?= $(shell test -x /usr/bin/python3 && echo /usr/bin/python3 || echo $(PYTHON))
CHP_VERSION ?= 4.6.3
ROOM_STAMP := $(ROOM)/venv/.labkit-installed
CHP := $(ROOM)/node_modules/.bin/configurable-http-proxy

$(ROOM_STAMP): requirements.txt requirements-dev.txt pyproject.toml
	test -x $(ROOM)/venv/bin/python || $(ROOM_PYTHON) -m venv $(ROOM)/venv
	$(ROOM)/venv/bin/python -m pip install --quiet --upgrade pip setuptools
	$(ROOM)/venv/bin/python -m pip install --quiet -r requirements.txt -r requirements-dev.txt
	$(ROOM)/venv/bin/python -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $@

$(CHP): Makefile
	npm install --prefix $(ROOM) --no-audit --no-fund --no-save configurable-http-proxy@$(CHP_VERSION)
	touch $@

# The proxy alone: the default suite's hub test (tests/room/test_hub_login.py) needs it.
room-proxy: $(CHP)

room-test: $(ROOM_STAMP) $(CHP)
	$(ROOM)/venv/bin/python -m pytest -p no:cacheprovider -m room tests/room -v $(PYTEST_ARGS)

# The room's images (docker/room/README.md): hub and learner built, two learners log in and
# each runs a 2-rank launch in their own container. Needs Docker; CI does not run it.
room-smoke:
	bash docker/room/smoke-test.sh

doctor: setup
	$(BIN)/labkit doctor

bench: setup
	$(BIN)/python benchmarks/launch.py

lint: setup
	$(BIN)/ruff check labkit tests benchmarks
	$(BIN)/ruff format --check labkit tests benchmarks

clean:
	rm -rf $(VENV) course-output .pytest_cache
