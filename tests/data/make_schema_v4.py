"""How ``schema-v4.sqlite`` was made: run with futoin-evt at schema version 4 (commit d35fa60)
on the path, ``python tests/data/make_schema_v4.py tests/data/schema-v4.sqlite``.

The file holds what a database of that release has: events (one with a content type), a user
with a consumer at a position and a claimed epoch, and a DCB event with tags.
"""

import asyncio
import sqlite3
import sys

from futoin_evt.domain.dcb import NewEvent
from futoin_evt.storage import open_store


async def main(path: str) -> None:
    async with await open_store(path) as store:
        for i in range(1, 6):
            await store.append("OLD", f'{{"n":{i}}}')
        await store.submit_append("AMQP", '{"k":1}', "application/json")
        user = await store.add_user("olduser", "hash-of-olduser", is_admin=True)
        await store.register_consumer(user, "OLDC")
        await store.claim_consumer(user, "OLDC")
        await store.claim_consumer(user, "OLDC")
        await store.acknowledge(user, "OLDC", 4)
        await store.dcb_append([NewEvent("Opened", '{"a":1}', ("acct:1", "kind"), "dcb-1")], None)
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.execute("VACUUM")
    print(path)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
