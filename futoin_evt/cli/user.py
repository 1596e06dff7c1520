"""``futoin-evt user``: users in the database, without a server."""

from __future__ import annotations

import argparse
import getpass
import sys

from ..auth.sas import is_policy, sas_key
from ..auth.scram import scram_credentials
from ..auth.users import hash_password
from .common import (
    BadSetting,
    CliError,
    Commands,
    add_db,
    add_sas_secret,
    opened_store,
    read_password,
    sas_secret,
)
from .grants import add_show


def add_commands(commands: Commands) -> None:
    user = commands.add_parser("user", help="manage users").add_subparsers(
        dest="user_command", required=True, metavar="ACTION"
    )
    add = user.add_parser(
        "add", help="add a user; the password is asked for twice on a terminal, or read from stdin"
    )
    add.add_argument("name", metavar="NAME", help=_NAME_HELP)
    add.add_argument(
        "--password-stdin",
        action="store_true",
        help="read the password from stdin's first line (default: ask on the terminal)",
    )
    add.add_argument(
        "--admin", action="store_true", help="every right on every stream, and the users"
    )
    add_db(add)
    add.set_defaults(run=_user_add)
    passwd = user.add_parser("passwd", help="set a user's password from stdin")
    passwd.add_argument("name", metavar="NAME", help="the user")
    passwd.add_argument(
        "--password-stdin", action="store_true", required=True, help="read it from stdin"
    )
    add_db(passwd)
    passwd.set_defaults(run=_user_passwd)
    listing = user.add_parser("list", help="list users")
    add_db(listing)
    listing.set_defaults(run=_user_list)
    remove = user.add_parser("remove", help="remove a user and their consumers")
    remove.add_argument("name", metavar="NAME", help="the user")
    add_db(remove)
    remove.set_defaults(run=_user_remove)
    sas = user.add_parser(
        "sas-key",
        help="print a user's shared access key, for Event Hubs clients (SharedAccessKey=); "
        "it changes with the user's password",
    )
    sas.add_argument("name", metavar="NAME", help="the user")
    add_db(sas)
    add_sas_secret(sas)
    sas.set_defaults(run=_user_sas_key)
    add_show(user)


_NAME_HELP = "the user's name: 1 to 64 characters without ':'"


def _new_password(from_stdin: bool) -> str:
    """``--password-stdin``'s line, else the password typed twice without echo on the
    terminal; without either, one sentence saying what to do."""
    if from_stdin:
        return read_password()
    if not sys.stdin.isatty():
        raise CliError("no terminal to ask for the password on: give it with --password-stdin.")
    password = getpass.getpass("Password: ")
    if not password:
        raise CliError("the password is empty.")
    if getpass.getpass("Password again: ") != password:
        raise CliError("the two passwords differ: nothing was changed.")
    return password


async def _user_add(args: argparse.Namespace) -> int:
    if not args.name or len(args.name) > 64 or ":" in args.name:
        raise CliError("a user name is 1 to 64 characters without ':'.")
    password = _new_password(args.password_stdin)
    password_hash, scram = hash_password(password), scram_credentials(password)
    async with opened_store(args.db) as store:
        try:
            await store.add_user(args.name, password_hash, is_admin=args.admin, scram=scram)
        except KeyError:
            raise CliError(f"user {args.name} exists already.") from None
    print(f"added user {args.name}")
    return 0


async def _user_passwd(args: argparse.Namespace) -> int:
    password = read_password()
    password_hash, scram = hash_password(password), scram_credentials(password)
    async with opened_store(args.db) as store:
        user = await store.get_user(args.name)
        if user is not None and is_policy(user):
            raise BadSetting(f"{args.name} is a SAS policy: it has no password.")
        if not await store.set_password(args.name, password_hash, scram):
            raise CliError(f"no user {args.name}.")
    print(f"password of {args.name} changed")
    return 0


async def _user_list(args: argparse.Namespace) -> int:
    async with opened_store(args.db) as store:
        for user in await store.list_users():
            kind = " (admin)" if user.is_admin else " (SAS policy)" if is_policy(user) else ""
            print(f"{user.name}{kind}")
    return 0


async def _user_sas_key(args: argparse.Namespace) -> int:
    secret = sas_secret(args.sas_secret, args.db)
    async with opened_store(args.db) as store:
        user = await store.get_user(args.name)
    if user is None:
        raise CliError(f"no user {args.name}.")
    print(sas_key(secret, user))
    return 0


async def _user_remove(args: argparse.Namespace) -> int:
    async with opened_store(args.db) as store:
        if not await store.remove_user(args.name):
            raise CliError(f"no user {args.name}.")
    print(f"removed user {args.name}")
    return 0
