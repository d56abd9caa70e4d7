"""Who watches whom: each member of a set watches the next few after it in sorted order.

Pure, and shared by the agent (which picks peers from its local fleet when the centre has
not assigned any) and the collector (which assigns every node of a cluster its peers).
"""

from __future__ import annotations

from collections.abc import Iterable


def successors(member: str, members: Iterable[str], count: int) -> list[str]:
    """Up to `count` others: the ones after `member` in sorted order, wrapping around.

    Each member watches its successors, so every member is watched by as many others as it
    watches (`count`, or all the others in a smaller set).
    """
    others = sorted(set(members) - {member})
    if count <= 0 or not others:
        return []
    start = sum(1 for other in others if other < member)
    ring = others[start:] + others[:start]
    return ring[:count]
