"""The lock keys that carry a template's execution count and its relations to other templates.

The scheduler only knows exclusive locks: a task is dispatched when it holds every key in its
`mutex_keys`. So every limit between tasks is written as shared keys:

- execution_count N: a task takes one of N slot keys `tpl.<name>.<cluster>[.<slot>]`, the
  slot chosen by a stable hash of its target, so at most N tasks of the template run at once
  per cluster. Two targets can hash to the same slot and then wait for each other: the bound
  is exact, the parallelism is not (a task never waits for a free slot other than its own).
- exclusion of templates A (N slots) and B (M slots): one key per pair of slots,
  `excl.<a>.<b>.<cluster>.<i>.<j>` (names sorted; just `excl.<a>.<b>.<cluster>` when N = M = 1).
  An A task in slot i takes every key of row i, a B task in slot j every key of column j:
  each A task shares a key with each B task, and two A tasks share none of these keys, so an
  exclusion never limits A against A (its own execution count does that).
"""

from __future__ import annotations

from dataclasses import dataclass
from hashlib import sha256


@dataclass(frozen=True)
class Exclusion:
    """Two templates whose tasks never run at the same time in one cluster."""

    first: str  # the names in sorted order, so both sides compute the same keys
    second: str
    first_slots: int
    second_slots: int

    @classmethod
    def between(cls, a: str, a_slots: int, b: str, b_slots: int) -> Exclusion:
        if b < a:
            a, a_slots, b, b_slots = b, b_slots, a, a_slots
        return cls(first=a, second=b, first_slots=a_slots, second_slots=b_slots)

    def other_slots(self, name: str) -> int:
        """How many keys a task of `name` takes for this exclusion."""
        return self.second_slots if name == self.first else self.first_slots

    def keys(self, name: str, cluster: str, own_slot: int) -> list[str]:
        """The keys a task of template `name` in slot `own_slot` takes."""
        base = f"excl.{self.first}.{self.second}.{cluster}"
        if self.first_slots == self.second_slots == 1:
            return [base]
        if name == self.first:
            cells = [(own_slot, j) for j in range(self.second_slots)]
        else:
            cells = [(i, own_slot) for i in range(self.first_slots)]
        return [f"{base}.{i}.{j}" for i, j in cells]


def slot_of(target: str, slots: int) -> int:
    """The execution slot of a target: stable across processes (unlike `hash`)."""
    if slots == 1:
        return 0
    return int.from_bytes(sha256(target.encode()).digest()[:8], "big") % slots


def execution_key(name: str, cluster: str, slots: int, slot: int) -> str:
    """The slot key that bounds how many tasks of a template run at once in a cluster."""
    return f"tpl.{name}.{cluster}" if slots == 1 else f"tpl.{name}.{cluster}.{slot}"
