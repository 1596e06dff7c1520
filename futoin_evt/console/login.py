"""The login and the logout: a session's cookie set and ended, and the page a login goes on
to (:mod:`.guard` says which may be)."""

from __future__ import annotations

from typing import Any, Final

from ..auth.users import Authenticator
from ..domain.principal import NotAuthenticated
from ..stats import INSECURE_CHANNEL
from .exchange import CONSOLE_DOOR, Call, ConsoleResponse, PageError, Routes, redirect
from .guard import LOGIN_COOKIE, login_csrf, login_token, new_login_token, next_page
from .pages import Pages

#: The session's cookie.
COOKIE: Final = "futoin_evt_console"


class LoginPages:
    def __init__(self, pages: Pages, authenticator: Authenticator) -> None:
        self._pages = pages
        self._auth = authenticator

    def routes(self) -> Routes:
        return {
            ("GET", "/login"): self._login_page,
            ("POST", "/login"): self._login,
            ("POST", "/logout"): self._logout,
        }

    async def _login_page(self, call: Call) -> ConsoleResponse:
        if call.session is not None:
            return redirect(self._next(call.query.get("next")))
        return self._login_form(call, 200, call.query.get("next"))

    def _login_form(
        self, call: Call, status: int, nxt: str | None, **values: Any
    ) -> ConsoleResponse:
        """The login page, its form's CSRF token bound to the pre-session cookie (set here
        when the browser has none)."""
        token = login_token(call.request.cookie(LOGIN_COOKIE))
        headers = []
        if token is None:
            token = new_login_token()
            headers.append(("Set-Cookie", self._cookie(call, LOGIN_COOKIE, token)))
        return self._pages.page(
            None,
            "login.html",
            status=status,
            headers=headers,
            next=next_page(self._pages.base, nxt) or "",
            csrf=login_csrf(token),
            **values,
        )

    def _cookie(self, call: Call, name: str, value: str, *, ended: bool = False) -> str:
        secure = "; Secure" if call.request.tls else ""
        gone = "; Max-Age=0" if ended else ""
        return f"{name}={value}; Path={self._pages.base}; HttpOnly; SameSite=Strict{gone}{secure}"

    async def _login(self, call: Call) -> ConsoleResponse:
        request, form = call.request, call.form
        name, password = form.get("user", ""), form.get("password", "")
        nxt = form.get("next", "")
        if not request.secure_channel:
            self._auth.refusals.note(CONSOLE_DOOR, INSECURE_CHANNEL)
            raise PageError(403, "Passwords are accepted only over TLS or loopback.")
        try:
            principal = await self._auth.authenticate(f"{name}:{password}", request.peer)
        except NotAuthenticated:
            return self._login_form(
                call, 401, nxt, user=name, message="Wrong user name or password."
            )
        sessions = self._pages.sessions
        await sessions.end(call.token)
        token = await sessions.create(principal)
        cookies = [
            ("Set-Cookie", self._cookie(call, COOKIE, token)),
            ("Set-Cookie", self._cookie(call, LOGIN_COOKIE, "", ended=True)),
        ]
        return redirect(self._next(nxt), cookies)

    async def _logout(self, call: Call) -> ConsoleResponse:
        await self._pages.sessions.end(call.token)
        cookie = self._cookie(call, COOKIE, "", ended=True)
        return redirect(f"{self._pages.base}/login", [("Set-Cookie", cookie)])

    def _next(self, target: str | None) -> str:
        """Where to go after the login: a page of the console, else its home."""
        return next_page(self._pages.base, target) or f"{self._pages.base}/streams"
