"""Durable consumer links (AMQP 2.6.13, 3.5.5): the durability a link's source is granted
(:func:`durability`), and the terminus it resumes, taken from the node's
:class:`~futoin_evt.amqp.resume.Termini`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

from ...quoting import quote_input
from ..engine.conditions import INVALID_FIELD
from ..engine.performatives import (
    Accepted,
    Modified,
    Received,
    Rejected,
    Released,
    Source,
    from_described,
)
from ..engine.session import Link
from ..engine.types import DecodeError, Described
from ..resume import MAX_TIMEOUT, MAX_UNSETTLED, KeptTerminus, Termini, TerminusKey
from ..table import ConnectionView, LinkRefused

#: Terminus expiry policies (AMQP 3.5.6).
LINK_DETACH: Final = "link-detach"
SESSION_END: Final = "session-end"
CONNECTION_CLOSE: Final = "connection-close"
NEVER: Final = "never"
#: A peer's unsettled map with more entries than this is refused.
MAX_PEER_UNSETTLED: Final = MAX_UNSETTLED
_STATES: Final = (Accepted, Rejected, Released, Modified, Received)


@dataclass(frozen=True, slots=True)
class Recovery:
    """A consumer link's durability as granted, and the terminus it resumes, if any."""

    termini: Termini
    key: TerminusKey
    #: The consumer group of the link's address (a terminus resumes only the same).
    group: str | None
    #: 1: configuration (the position alone), 2: unsettled state too; 0: none.
    durable: int
    #: session-end or connection-close.
    expiry: str
    timeout: int
    #: Our terminus, as granted (None: not durable).
    source: Source | None
    kept: KeptTerminus | None
    #: The peer's unsettled map (tag -> its state).
    peer_unsettled: Mapping[bytes, Any]


def durability(
    termini: Termini, conn: ConnectionView, link: Link, group: str | None
) -> Recovery | None:
    """The durability granted to a consumer link of ``group`` (durable 0: none), or
    None when the link has no source (or no user or container id: nothing to find it
    by); :class:`LinkRefused` for a bad expiry policy or unsettled map."""
    peer_unsettled = _peer_unsettled(link)
    source = link.remote_source
    principal, container = conn.principal, conn.container_id
    if source is None or principal is None or container is None:
        return None
    key = TerminusKey(principal.user_id, container, link.name)
    durable = source.durable
    policy = _expiry_policy(source)
    if durable not in (1, 2) or policy == LINK_DETACH:
        return Recovery(termini, key, group, 0, policy, 0, None, None, peer_unsettled)
    granted = CONNECTION_CLOSE if policy == NEVER else policy
    timeout = min(source.timeout, MAX_TIMEOUT)
    answer = replace(source, durable=durable, expiry_policy=granted, timeout=timeout)
    return Recovery(termini, key, group, durable, granted, timeout, answer, None, peer_unsettled)


def forget(termini: Termini, recovery: Recovery | None) -> None:
    """A link that is not durable: the terminus kept under its name is dropped."""
    if recovery is not None:
        termini.discard(recovery.key)


async def recover(
    termini: Termini, recovery: Recovery | None, partition_key: int
) -> Recovery | None:
    """The recovery granted, with the terminus it resumes, taken from the store (one
    kept under its name for another address is dropped)."""
    if recovery is None or not recovery.durable:
        forget(termini, recovery)
        return None
    kept = await termini.take(recovery.key, partition_key, recovery.group)
    return replace(recovery, kept=kept)


def restore_kept(recovery: Recovery | None) -> None:
    """Keep again the terminus a link took and will not resume (it went first)."""
    if recovery is not None and recovery.kept is not None:
        recovery.termini.restore(recovery.kept)


def _expiry_policy(source: Source) -> str:
    """The source's terminus expiry policy (AMQP's default when none); refused when it is
    none of AMQP's."""
    policy = source.expiry_policy if source.expiry_policy is not None else SESSION_END
    if policy not in (LINK_DETACH, SESSION_END, CONNECTION_CLOSE, NEVER):
        raise LinkRefused(INVALID_FIELD, f"not a terminus expiry policy: {quote_input(policy, 40)}")
    return policy


def _peer_unsettled(link: Link) -> Mapping[bytes, Any]:
    """The peer's unsettled map of the attach, checked (AMQP 2.6.13)."""
    unsettled = link.remote.unsettled
    if unsettled is None:
        return {}
    if not isinstance(unsettled, Mapping):
        raise LinkRefused(INVALID_FIELD, "the unsettled map must be a map")
    if len(unsettled) > MAX_PEER_UNSETTLED:
        raise LinkRefused(
            INVALID_FIELD,
            f"an unsettled map of {len(unsettled)} deliveries (at most {MAX_PEER_UNSETTLED})",
        )
    states: dict[bytes, Any] = {}
    for tag, value in unsettled.items():
        if not isinstance(tag, bytes):
            raise LinkRefused(INVALID_FIELD, "the unsettled map's keys must be delivery tags")
        try:
            state = from_described(value) if isinstance(value, Described) else value
        except DecodeError:
            state = value
        if state is not None and not isinstance(state, _STATES):
            raise LinkRefused(
                INVALID_FIELD, "the unsettled map's values must be delivery states or null"
            )
        states[tag] = state
    return states
