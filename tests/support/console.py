"""Logging in to the console as a browser does: the login page first (its pre-session cookie
and the form's CSRF token), then the form."""

from __future__ import annotations

import re

import httpx


def csrf_in(page: str) -> str:
    """The CSRF token of the (first) form of ``page``."""
    token = re.search(r'name="csrf" value="([^"]+)"', page)
    assert token is not None, "the page has no CSRF token"
    return token.group(1)


async def console_login(
    http: httpx.AsyncClient, user: str, password: str, **fields: str
) -> httpx.Response:
    """``http`` (based at the console's URL, keeping cookies) logs in as ``user``; the
    login's answer (303 when it worked)."""
    page = await http.get("login")
    form = {"user": user, "password": password, "csrf": csrf_in(page.text), **fields}
    return await http.post("login", data=form)
