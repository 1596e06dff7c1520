"""What a value that no rule allows raises, at the bottom of the domain: the rules of events
(:mod:`.stream`) and of their attributes (:mod:`.attrs`) raise it alike."""

from __future__ import annotations


class BadInput(ValueError):
    """A value that no rule allows, said in one sentence for the caller: every door answers it
    as its wire's bad request (:mod:`futoin_evt.log.errors`)."""


class EventRejected(BadInput):
    """An event that cannot be stored as given (bad type, data too large, not JSON, a bad
    key, bad attributes, or its type's schema refuses it)."""
