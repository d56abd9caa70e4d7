"""Test helpers of the router tests: the models a node reports it serves."""

from __future__ import annotations

from schemas.events.v1 import ServedModel


def served(model: str, version: str, family: str, *, state: str = "ready",
           limit: int = 4) -> ServedModel:
    return ServedModel.model_validate({"task_type": "digits", "model": model,
                                       "version": version, "family": family, "state": state,
                                       "max_concurrency": limit})
