"""``futoin-evt sas policy``: shared access policies for Event Hubs clients, in the database.

A policy has a name (the connection string's ``SharedAccessKeyName``), a stream pattern and
claims (Send = write, Listen = read, Manage = manage on the streams of the pattern); ``add``
prints its key (``SharedAccessKey``). Making a policy again gives it a new key."""

from __future__ import annotations

import argparse

from ..auth.sas import claims_text, is_policy, parse_claims, policy_hash, sas_key
from ..domain.rights import BadGrant, Right, check_pattern
from .common import BadSetting, Commands, add_db, add_sas_secret, opened_store, sas_secret


def add_commands(commands: Commands) -> None:
    sas = commands.add_parser("sas", help="shared access policies for Event Hubs clients")
    policy = sas.add_subparsers(dest="sas_command", required=True, metavar="ACTION")
    policy = policy.add_parser("policy", help="shared access policies").add_subparsers(
        dest="policy_command", required=True, metavar="ACTION"
    )
    add = policy.add_parser("add", help="add a policy and print its key")
    add.add_argument("name", metavar="NAME", help="the connection string's SharedAccessKeyName")
    add.add_argument(
        "--stream", required=True, metavar="PATTERN", help="a stream, a prefix ending in *, or *"
    )
    add.add_argument(
        "--claims",
        required=True,
        metavar="CLAIMS",
        help="a comma list of Send (write), Listen (read), Manage",
    )
    add_db(add)
    add_sas_secret(add)
    add.set_defaults(run=_add)
    listing = policy.add_parser("list", help="list policies with their claims")
    add_db(listing)
    listing.set_defaults(run=_list)
    remove = policy.add_parser("remove", help="remove a policy: its key stops working")
    remove.add_argument("name", metavar="NAME", help="the policy's name")
    add_db(remove)
    remove.set_defaults(run=_remove)


async def _add(args: argparse.Namespace) -> int:
    try:
        pattern = check_pattern(args.stream)
        rights = parse_claims(args.claims)
    except BadGrant as exc:
        raise BadSetting(f"{exc}.") from None
    if not args.name or len(args.name) > 64 or ":" in args.name:
        raise BadSetting("a policy name is 1 to 64 characters without ':'.")
    secret = sas_secret(args.sas_secret, args.db)
    async with opened_store(args.db) as store:
        try:
            user_id = await store.add_user(args.name, policy_hash())
        except KeyError:
            raise BadSetting(f"a user or policy named {args.name} exists already.") from None
        await store.grant(user_id, pattern, int(rights))
        user = await store.get_user(args.name)
    assert user is not None
    print(sas_key(secret, user))
    return 0


async def _list(args: argparse.Namespace) -> int:
    async with opened_store(args.db) as store:
        policies = [user for user in await store.list_users() if is_policy(user)]
        grants = await store.list_grants()
    for policy in policies:
        held = [g for g in grants if g.user_id == policy.id]
        scopes = "; ".join(f"{claims_text(Right(g.rights))} on {g.pattern}" for g in held)
        print(f"{policy.name}  {scopes or 'no claims'}")
    return 0


async def _remove(args: argparse.Namespace) -> int:
    async with opened_store(args.db) as store:
        user = await store.get_user(args.name)
        if user is None or not is_policy(user):
            raise BadSetting(f"no policy {args.name}.")
        await store.remove_user(args.name)
    print(f"removed policy {args.name}")
    return 0
