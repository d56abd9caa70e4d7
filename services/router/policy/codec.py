"""The statistics in Redis hashes: one flat `dict[str, float]` per entry, and per snapshot.

`encode_counts`/`encode_arm` and `decode_counts`/`decode_arm` turn one level or one arm into
a flat hash (field names are the value's own) and back; `to_flat`/`from_flat` do the same for
a whole snapshot in one hash (field `<key>|<name>`). Decoding takes str or bytes, as Redis
returns them, and refuses anything that is not a finite number.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import fields

from services.router.policy.stats import ArmState, Counts, StatsSnapshot

FIELD_SEP = "|"

_COUNT_FIELDS = tuple(f.name for f in fields(Counts))
_ARM_FIELDS = tuple(f.name for f in fields(ArmState) if f.name != "counts")
_INT_FIELDS = frozenset(f.name for f in fields(ArmState) if f.type in ("int", "bool"))


def encode_counts(counts: Counts) -> dict[str, float]:
    """One level as a flat hash."""
    return {name: float(getattr(counts, name)) for name in _COUNT_FIELDS}


def encode_arm(arm: ArmState) -> dict[str, float]:
    """One arm as a flat hash (counts fields first, then the arm's own)."""
    out = encode_counts(arm.counts)
    for name in _ARM_FIELDS:
        out[name] = float(getattr(arm, name))
    return out


def _num(value: float | int | str | bytes) -> float:
    if isinstance(value, bytes):
        value = value.decode()
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"not a finite number: {value!r}")
    return number


def decode_counts(hash_: Mapping[str, float | int | str | bytes]) -> Counts:
    """A level from its flat hash; missing fields are 0."""
    return Counts(**{n: _num(hash_[n]) for n in _COUNT_FIELDS if n in hash_})


def decode_arm(hash_: Mapping[str, float | int | str | bytes]) -> ArmState:
    """An arm from its flat hash; missing fields take their defaults."""
    values: dict[str, float | int | bool] = {}
    for name in _ARM_FIELDS:
        if name in hash_:
            number = _num(hash_[name])
            if name == "quarantined":
                values[name] = number != 0.0
            elif name in _INT_FIELDS:
                values[name] = int(number)
            else:
                values[name] = number
    return ArmState(counts=decode_counts(hash_), **values)  # type: ignore[arg-type]


def to_flat(snapshot: StatsSnapshot) -> dict[str, float]:
    """The whole snapshot as one flat hash: `<key>|<field>` -> value."""
    out: dict[str, float] = {}
    for key, counts in sorted(snapshot.levels.items()):
        for name, value in encode_counts(counts).items():
            out[f"{key}{FIELD_SEP}{name}"] = value
    for key, arm in sorted(snapshot.arms.items()):
        for name, value in encode_arm(arm).items():
            out[f"{key}{FIELD_SEP}{name}"] = value
    return out


def from_flat(flat: Mapping[str, float | int | str | bytes]
              | Mapping[bytes, float | int | str | bytes]) -> StatsSnapshot:
    """A snapshot from `to_flat`'s hash (str or bytes keys and values, as Redis returns)."""
    grouped: dict[str, dict[str, float | int | str | bytes]] = {}
    for raw_key, value in flat.items():
        text = raw_key.decode() if isinstance(raw_key, bytes) else raw_key
        key, sep, name = text.rpartition(FIELD_SEP)
        if not sep:
            raise ValueError(f"not a snapshot field: {text!r}")
        grouped.setdefault(key, {})[name] = value
    levels = {k: decode_counts(v) for k, v in grouped.items() if not k.startswith("arm:")}
    arms = {k: decode_arm(v) for k, v in grouped.items() if k.startswith("arm:")}
    return StatsSnapshot(levels=levels, arms=arms)
