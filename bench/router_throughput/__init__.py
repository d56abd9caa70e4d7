"""Router throughput on the real Redis and broker: how many ML tasks/s does one instance route?

One router, built as services/router/app.py builds it (its settings, a real Kafka broker for
its publishes, the registry and statistics in the real Redis), is given a cluster of 8 nodes
serving 5 model versions each (registered through the registry's own `apply`, with
NodeReports). It is driven as the service's subscribers drive it: submissions go through
`Router.on_submitted` and answers through `Router.on_result`, each consumer one message at
a time (a FastStream subscriber's default), a TransientError retried after the dead-letter
middleware's delays; the sweep runs beside every `sweep_interval_s`. The router's bus
publishes every event to the broker (and waits for its ack, as in production) and tells the
benchmark when a command or a final outcome went out. The simulated agents answer every
published run_inference command at once, successfully (no agent processes, nothing
consumed from Kafka); a command published again is answered again, marked duplicate, as the
agent answers from its journal.

Per concurrency C (tasks in flight), two runs of N tasks each:

* waves: C tasks submitted at once, the agents keeping their answers until every one of
  them was dispatched (decision + dispatch), then the C answers at once until every final
  outcome went out (conclude + statistics): submissions/s and results/s;
* closed loop: C tasks in flight, a new one as each ends: end-to-end tasks/s, and the
  latency per task inside the router (from the submission's arrival at the router to its
  final outcome's publish, queueing in the router's consumers included; the agent answers
  at once), p50 and p99.

An attempt still unanswered after `attempt_timeout_s` (3 s) times out and is retried, as in
production, and its retry answered too: the figures count such timeouts, tasks that did not
succeed, commands published twice and handler errors (an overloaded or racing router).

Redis commands per task are INFO commandstats deltas over the closed loop (server side, so
commands run inside scripts count; other clients of a shared server count too), beside the
commands and round trips the router's own connection sent (counted client side).
A warm-up (default 400 tasks at C=8) runs first, so arms are past their cold phase.

Run: `python -m bench.router_throughput` (--tasks, --concurrency, --profile FILE).

The parts: `workload` (the fleet, the tasks, the agents' answers and the figures: pure),
`instruments` (counting the router's Redis commands, tapping its bus), `run` (the service
loop, the driver and the cases) and `__main__` (the command line).
"""
