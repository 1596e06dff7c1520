"""One Event Hubs consumer process as users run it: EventHubConsumerClient over every
partition of a hub, sharing its consumer group through futoin-evt's checkpoint store.

Usage: python eventhubs_consumer.py CONN_STR [aio]. Prints one JSON line per happening
(``owned``/``released`` a partition, ``event`` received, ``checkpoint`` stored), flushed at
once. It runs until it is killed."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

OPTIONS: dict[str, Any] = {
    "consumer_group": "$Default",
    "load_balancing_interval": 1,
    "partition_ownership_expiration_interval": 4,
    "load_balancing_strategy": "balanced",
}


def say(**line: Any) -> None:
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()


def event_line(context: Any, event: Any) -> dict[str, Any]:
    return {
        "partition": context.partition_id,
        "sequence": event.sequence_number,
        "body": event.body_as_json(),
    }


def run_sync(conn_str: str) -> None:
    from azure.eventhub import EventHubConsumerClient

    from futoin_evt.eventhubs import FutoinCheckpointStore

    store = FutoinCheckpointStore.from_connection_string(conn_str)
    client = EventHubConsumerClient.from_connection_string(
        conn_str, checkpoint_store=store, **OPTIONS
    )

    def on_event(context: Any, event: Any) -> None:
        line = event_line(context, event)
        say(kind="event", **line)
        context.update_checkpoint(event)
        say(kind="checkpoint", **line)

    with client, store:
        client.receive(
            on_event=on_event,
            on_partition_initialize=lambda c: say(kind="owned", partition=c.partition_id),
            on_partition_close=lambda c, _r: say(kind="released", partition=c.partition_id),
            starting_position="-1",
        )


async def run_aio(conn_str: str) -> None:
    from azure.eventhub.aio import EventHubConsumerClient

    from futoin_evt.eventhubs.aio import FutoinCheckpointStore

    store = FutoinCheckpointStore.from_connection_string(conn_str)
    client = EventHubConsumerClient.from_connection_string(
        conn_str, checkpoint_store=store, **OPTIONS
    )

    async def on_event(context: Any, event: Any) -> None:
        line = event_line(context, event)
        say(kind="event", **line)
        await context.update_checkpoint(event)
        say(kind="checkpoint", **line)

    async def owned(context: Any) -> None:
        say(kind="owned", partition=context.partition_id)

    async def released(context: Any, _reason: Any) -> None:
        say(kind="released", partition=context.partition_id)

    async with client, store:
        await client.receive(
            on_event=on_event,
            on_partition_initialize=owned,
            on_partition_close=released,
            starting_position="-1",
        )


if __name__ == "__main__":
    if sys.argv[2:] == ["aio"]:
        asyncio.run(run_aio(sys.argv[1]))
    else:
        run_sync(sys.argv[1])
