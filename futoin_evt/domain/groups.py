"""AMQP consumer groups held across processes: the answer to a claim of a group on one
partition (one active link per user, group and partition in the whole cluster)."""

from __future__ import annotations

from typing import NamedTuple

from .stream import UserId


class GroupClaim(NamedTuple):
    """What a claim of a consumer group on a partition found."""

    #: True: the caller's link holds the group now; False: a live holder keeps it.
    taken: bool
    #: The group's claim number: the caller's when taken, else the holder's. Every new
    #: holder bumps it, so a link that holds an older one has lost the group.
    claim: int
    #: The epoch (owner level) in force: the caller's when taken, else the holder's.
    epoch: int


#: A link's hold of a group on a partition, as renewed: (user id, group, claim number).
GroupHold = tuple[UserId, str, int]
