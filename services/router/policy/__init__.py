"""ClusterWarden's ML task selection policy: pure code, no I/O (docs/routing-policy.md).

How a router uses it, per attempt:

1. `keys = selector.snapshot_keys(candidates)`; load those entries (e.g. Redis hashes
   decoded with `codec.decode_counts` / `codec.decode_arm`, or one hash with `codec.from_flat`).
2. `d = selector.select(task, candidates, snapshot, now, rng, config)`; publish
   `d.to_dict()` (replayable with `selector.replay`); dispatch to `d.model` on `d.node`
   unless `d.status` is `saturated` or `no_candidates`.
3. `snapshot = selector.commit(snapshot, d, config)` and write it back atomically.
4. On the outcome: `snapshot = updates.record(snapshot, stats.Outcome(...), now, config)`;
   then `plan = selector.retry_plan(task, cause, attempts, budget, now=now, config=config)`
   and, if `plan.retry`, select again for `plan.next_task`.

`now` is seconds on one clock shared by every instance (epoch seconds in the service, the
virtual clock in `bench.routing`). Causes and what they count against:
`attribution.ATTRIBUTION`. All limits: `config.SelectorConfig`.
"""
