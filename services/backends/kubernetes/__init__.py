"""The Kubernetes backend: cordons, taints, evicts and watches a cluster through its API server
(docs/kubernetes.md). `protocol.py` holds the pure decisions (the annotation and taint
protocol, the one-owner rule); the other modules do the I/O."""
