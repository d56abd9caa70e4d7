"""Scheduler: queues tasks in Redis by priority and dispatches them under per-target locks."""
