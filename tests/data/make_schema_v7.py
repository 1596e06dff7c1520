"""How ``schema-v7.sqlite`` was made: run with futoin-evt at schema version 7 (commit 968d0ee)
on the path, ``python tests/data/make_schema_v7.py tests/data/schema-v7.sqlite``.

The file holds what a database of the release before rights per stream has: a stream
``payroll`` with events, users ``alice`` and ``bob`` (not admins, password ``pw``) and
``root`` (an admin), and a consumer of bob's on ``payroll``.
"""

import asyncio
import sqlite3
import sys

from futoin_evt.auth.users import hash_password
from futoin_evt.storage import open_store


async def main(path: str) -> None:
    async with await open_store(path) as store:
        info = await store.add_stream("payroll", 1)
        payroll = store.partition_log(info.partitions[0])
        await payroll.append("SALARY", '{"who":"alice","amount":1}')
        password_hash = hash_password("pw")
        await store.add_user("alice", password_hash)
        bob = await store.add_user("bob", password_hash)
        await store.add_user("root", password_hash, is_admin=True)
        await payroll.register_consumer(bob, "PAYCALC")
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.execute("VACUUM")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
