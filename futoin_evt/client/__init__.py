"""Clients of the futoin-evt server."""

from .aio import CommError, Event, EventStreamClient, FTN3Client, RemoteError

__all__ = ["CommError", "Event", "EventStreamClient", "FTN3Client", "RemoteError"]
