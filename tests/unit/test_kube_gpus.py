"""A pod's GPUs as the scheduler counts them (its effective request), one rule for the agent
and the backend: app containers and sidecars add up, a regular init container runs alone
beside the sidecars started before it, a request defaults to its limit."""

from __future__ import annotations

from typing import Any

import pytest

from schemas.kube_gpus import pod_gpus


def container(gpus: int | str | None = None, *, requests: int | None = None,
              sidecar: bool = False) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if gpus is not None:
        resources["limits"] = {"nvidia.com/gpu": str(gpus)}
    if requests is not None:
        resources["requests"] = {"nvidia.com/gpu": str(requests)}
    made: dict[str, Any] = {"name": "c", "resources": resources}
    if sidecar:
        made["restartPolicy"] = "Always"
    return made


def pod(containers: list[dict[str, Any]],
        init: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": containers}
    if init is not None:
        spec["initContainers"] = init
    return {"metadata": {"name": "p"}, "spec": spec}


@pytest.mark.parametrize(("made", "gpus"), [
    (pod([container(2), container(1)]), 3),                 # app containers add up
    (pod([container(requests=2)]), 2),                      # a request alone counts
    (pod([container(2, requests=2)]), 2),                   # both set: equal, not added
    (pod([container()]), 0),
    (pod([container("lots"), container(1)]), 1),            # not a whole number: none
    (pod([container(-3)]), 0),
    (pod([container(1)], init=[container(4)]), 4),          # a regular init runs alone
    (pod([container(4)], init=[container(2)]), 4),
    (pod([container(1)], init=[container(1, sidecar=True)]), 2),  # a sidecar stays beside
    # The init container after a sidecar runs beside it: 3 + 1; the app phase is 1 + 1.
    (pod([container(1)], init=[container(1, sidecar=True), container(3)]), 4),
    # Before the sidecar starts, the init container runs alone: 3; the app phase 2 + 1.
    (pod([container(2)], init=[container(3), container(1, sidecar=True)]), 3),
    ({"metadata": {"name": "p"}}, 0),
])
def test_a_pods_gpus_are_its_effective_request(made: dict[str, Any], gpus: int) -> None:
    assert pod_gpus(made) == gpus
