"""Routing benchmark: a seeded discrete-event simulator (virtual clock) that runs the
production selector (`services.router.policy.selector`, unchanged) side by side with
baseline routers on the scenarios of docs/routing.md §The simulated world. Run
`python -m bench.routing --help`."""
