# ClusterWarden: `make demo` runs the system with a local fleet; `make test` runs every test.
# Both install what is missing first (deploy/local/setup.sh).
SHELL := /bin/bash
BIN := .venv/bin

.PHONY: setup demo test test-random lint typecheck unit up down bench asyncapi clean

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

# Every test in a shuffled order (the seed is printed; `-p random_order --random-order-seed=N`
# repeats one), to find tests that depend on the order they run in.
test-random: setup
	@deploy/local/test.sh --random-order-bucket=global

# The pure tests only: no service, no browser. The summary says how many it left out.
unit: setup
	$(BIN)/python -m pytest tests/unit tests/contracts -m unit

up: setup
	deploy/local/kafka.sh start
	deploy/local/redis.sh start
	deploy/local/postgres.sh start
	deploy/local/alertmanager.sh start
	deploy/local/kubernetes.sh start

down:
	-deploy/local/kubernetes.sh stop
	-deploy/local/alertmanager.sh stop
	-deploy/local/postgres.sh stop
	-deploy/local/redis.sh stop
	-deploy/local/kafka.sh stop

bench: setup
	@source deploy/local/env.sh && $(BIN)/python -m bench.collector_throughput
	@source deploy/local/env.sh && $(BIN)/python -m bench.kubernetes_remediation
	@source deploy/local/env.sh && $(BIN)/python -m bench.chaos_schedule

# The AsyncAPI document of every service, from the code (docs/asyncapi/): what it receives,
# then what it sends (the access table, schemas/access.py) and the event schemas.
asyncapi: setup
	@for svc in collector analyzer templater scheduler executor store router tuner; do \
	  WARDEN_STATE_DIR=$$(mktemp -d) $(BIN)/faststream docs gen services.$$svc.app:create_app \
	    --factory -o docs/asyncapi/$$svc.json; done
	@AGENT_NODE_ID=node-001 $(BIN)/faststream docs gen agent.app:create_app --factory \
	  -o docs/asyncapi/agent.json
	@$(BIN)/python -m schemas.asyncapi docs/asyncapi

clean: down
	rm -rf .state .venv deploy/kafka/target
