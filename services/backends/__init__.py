"""Backends: how a cluster's nodes and jobs are really acted on.

Templates name step actions (`offline_node`, `online_node`, `drain_node`, `add_capacity`, ...);
each registered cluster names the backend that carries them out. `base.py` is the seam: the
`Backend` protocol and the small result types every backend answers with. `kubernetes/` acts
on a Kubernetes cluster through its API server.
"""
