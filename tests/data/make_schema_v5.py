"""How ``schema-v5.sqlite`` was made: run with futoin-evt at schema version 5 (commit 77ade4b)
on the path, ``python tests/data/make_schema_v5.py tests/data/schema-v5.sqlite``.

The file holds what a database of that release has: events in ``events``/0, a stream
``orders`` of two partitions with events in each, a user with a consumer on ``orders``/1.
"""

import asyncio
import sqlite3
import sys

from futoin_evt.storage import open_store


async def main(path: str) -> None:
    async with await open_store(path) as store:
        for i in range(1, 4):
            await store.append("OLD", f'{{"n":{i}}}')
        info = await store.add_stream("orders", 2)
        first, second = (store.partition_log(p) for p in info.partitions)
        for i in range(1, 4):
            await first.append("ORDER", f'{{"p":0,"n":{i}}}')
        await second.submit_append("ORDER", '{"p":1,"n":1}', "application/json")
        await second.append("ORDER", '{"p":1,"n":2}')
        user = await store.add_user("olduser", "hash-of-olduser")
        await second.register_consumer(user, "OLDC")
        await second.acknowledge(user, "OLDC", 1)
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.execute("VACUUM")
    print(path)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
