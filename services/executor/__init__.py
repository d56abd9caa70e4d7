"""Executor: runs each task as a durable workflow of signed commands to agents."""
