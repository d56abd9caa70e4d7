"""The inventory service: each non-local cluster's orchestrator watched, its queued demand
reported (docs/kubernetes.md, "Queued demand")."""
