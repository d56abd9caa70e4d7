"""What only the services share: locks, Redis keys, the node registry and node state, the
audit log and the service lifecycle (the agent's and services' common plumbing is `common/`)."""
