# ClusterWarden: `make demo` runs the system with a local fleet; `make test` runs every test.
# Both install what is missing first (deploy/local/setup.sh).
SHELL := /bin/bash
BIN := .venv/bin

.PHONY: setup demo test lint typecheck unit up down bench asyncapi clean

setup:
	@deploy/local/setup.sh

demo: setup
	@deploy/local/demo.sh

test: setup
	@deploy/local/test.sh

lint: setup
	$(BIN)/ruff check .

typecheck: setup
	$(BIN)/mypy

unit: setup
	$(BIN)/python -m pytest tests/unit tests/contracts

up: setup
	deploy/local/kafka.sh start
	deploy/local/redis.sh start

down:
	-deploy/local/redis.sh stop
	-deploy/local/kafka.sh stop

bench: setup
	@source deploy/local/env.sh && $(BIN)/python -m bench.collector_throughput

asyncapi: setup
	$(BIN)/python -m services.asyncapi docs/asyncapi.json

clean: down
	rm -rf .state .venv deploy/kafka/target
