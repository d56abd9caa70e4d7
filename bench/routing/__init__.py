"""Routing benchmark: a seeded discrete-event simulator (virtual clock) that runs the
production selector (`policy.selector`, unchanged) side by side with baseline routers on
the scenarios of ROUTING.md §5.3. Run `python -m bench.routing --help`."""
