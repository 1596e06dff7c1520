"""What a request must be before the console acts on it: where a login may send the browser
next, which sites a form may come from, and the login form's own CSRF token.

The login form has no session yet to bind a token to, so the login page sets a pre-session
cookie (random, ``HttpOnly``, ``SameSite=Strict``) and its form carries an HMAC of that
cookie's value: a site that cannot read the cookie cannot make the token (a login CSRF that
would log a victim in as the attacker). Stateless: any worker and any process checks it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
from collections.abc import Mapping
from typing import Final
from urllib.parse import urlsplit

#: The pre-session cookie of the login form.
LOGIN_COOKIE: Final = "futoin_evt_console_login"
#: What a pre-session cookie's value is (as :func:`new_login_token` makes it).
_LOGIN_TOKEN: Final = re.compile(r"[A-Za-z0-9_-]{43}")
#: A page of the console a login may go on to: printable ASCII, no space, no backslash.
_NEXT: Final = re.compile(r"[!-\[\]-~]+")


def new_login_token() -> str:
    return secrets.token_urlsafe(32)


def login_token(value: str | None) -> str | None:
    """A pre-session cookie's value when it is one the console made, else None."""
    return value if value is not None and _LOGIN_TOKEN.fullmatch(value) else None


def login_csrf(token: str) -> str:
    """The login form's CSRF token for the pre-session cookie ``token``."""
    mac = hmac.new(token.encode(), b"futoin-evt console login csrf", hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac).rstrip(b"=").decode("ascii")


def login_csrf_matches(token: str | None, value: str | None) -> bool:
    if token is None or value is None:
        return False
    return hmac.compare_digest(value.encode(), login_csrf(token).encode())


def next_page(base: str, target: str | None) -> str | None:
    """``target`` when it is a page of the console (``BASE/...``: printable ASCII, no ``//``,
    no backslash, no ``..`` segment), else None."""
    if not target or not _NEXT.fullmatch(target) or not target.startswith(base + "/"):
        return None
    path = urlsplit(target).path
    if "//" in target or ".." in path.split("/"):
        return None
    return target


def foreign(headers: Mapping[str, str], tls: bool) -> str | None:
    """Why a form's request comes from another site, or None when it does not (as far as the
    browser tells: a client that sends neither ``Origin`` nor ``Sec-Fetch-Site`` is judged by
    its CSRF token alone). ``Origin: null`` (a sandboxed frame, a ``data:`` page, a redirect
    from elsewhere) is refused; an origin is the console's own only when it is exactly a
    scheme the console is served on and its ``Host``."""
    site = headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return "The form was sent from another site."
    origin = headers.get("origin")
    if origin is None:
        return None
    if origin == "null":
        return "The form was sent from a page with no origin (a sandboxed frame or a file)."
    url = urlsplit(origin)
    schemes = ("https",) if tls else ("http", "https")  # https: TLS may end at a proxy
    if (
        url.scheme not in schemes
        or not url.netloc
        or url.netloc != headers.get("host")
        or url.path
        or url.query
    ):
        return "The form was sent from another site."
    return None
