"""Headless Chromium as the tests and the MLflow-UI benchmark start it (Debian's ``chromium``),
and a page of it driven over the DevTools protocol."""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from tests.integration.conftest import stop_group
from tests.ports import free_port

CHROMIUM = Path("/usr/bin/chromium")
#: the browser window's omnibox popup as a WebUI page (``chrome://omnibox-popup.top-chrome/``):
#: Chromium preloads it in a renderer of its own for every window, so every browser context a
#: test opens (a window each), though a headless browser never shows it (~0.8 CPU-s each)
NO_OMNIBOX_WEBUI = "--disable-features=WebUIOmniboxPopup,WebUIOmniboxAimPopup,WebUIOmniboxFullPopup"
#: a headless browser that reaches nothing but the pages it is given, without the window's
#: WebUI that nothing headless shows (:data:`NO_OMNIBOX_WEBUI`)
HEADLESS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    NO_OMNIBOX_WEBUI,
]
FLAGS = [*HEADLESS, "--remote-allow-origins=*"]


@contextlib.contextmanager
def devtools(profile: Path, flags: Sequence[str] = ()) -> Iterator[str]:
    """A headless Chromium (``flags`` added to :data:`FLAGS`): the DevTools WebSocket URL of
    its blank page."""
    with _launched(profile, flags) as targets:
        yield next(t["webSocketDebuggerUrl"] for t in targets("list") if t["type"] == "page")


@contextlib.contextmanager
def browser_ws(profile: Path, flags: Sequence[str] = ()) -> Iterator[str]:
    """A headless Chromium (``flags`` added to :data:`FLAGS`): the DevTools WebSocket URL of
    the browser itself (``Target.*`` commands, e.g. a browser context per user)."""
    with _launched(profile, flags) as targets:
        yield targets("version")["webSocketDebuggerUrl"]


@contextlib.contextmanager
def browser_contexts(profile: Path, flags: Sequence[str] = ()) -> Iterator[Contexts]:
    """A headless Chromium (``flags`` added to :data:`FLAGS`) driven at the browser level: a
    page per user, each in a browser context of its own (:class:`Contexts`), all from one
    launch (~1 CPU-s each saved)."""
    from websockets.sync.client import connect

    with (
        browser_ws(profile, flags) as url,
        connect(url, max_size=None, open_timeout=30) as ws,
    ):
        yield Contexts(ws)


class Contexts:
    """The browser's DevTools connection: commands to the browser or to one page (a flattened
    session), and each page's events kept apart.

    Args:
        ws: the browser's DevTools WebSocket.
    """

    def __init__(self, ws) -> None:
        self.ws = ws
        self.ids = itertools.count(1)
        self.events: dict[str, list[dict]] = {}

    def call(self, method: str, session: str | None = None, **params) -> dict:
        """Send a DevTools command (to ``session``'s page, else the browser); its result."""
        sent = next(self.ids)
        message = {"id": sent, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        self.ws.send(json.dumps(message))
        while True:
            answer = json.loads(self.ws.recv(timeout=30))
            if answer.get("id") == sent:
                return answer.get("result", {})
            if "method" in answer and answer.get("sessionId") in self.events:
                self.events[answer["sessionId"]].append(answer)

    def open(
        self, user: str, password: str, events: list[dict] | None = None
    ) -> tuple[str, Callable[..., dict], list[dict]]:
        """A new browser context with a blank page that sends ``user``'s basic-auth login with
        every request (:func:`logged_in`): its id, the page's ``call`` and where its events
        arrive (``events``, or a new list)."""
        context = self.call("Target.createBrowserContext")["browserContextId"]
        target = self.call("Target.createTarget", url="about:blank", browserContextId=context)
        session = self.call("Target.attachToTarget", targetId=target["targetId"], flatten=True)
        sid = session["sessionId"]
        self.events[sid] = [] if events is None else events

        def page_call(method: str, **params) -> dict:
            return self.call(method, sid, **params)

        login = base64.b64encode(f"{user}:{password}".encode()).decode()
        page_call("Network.enable")
        page_call("Network.setExtraHTTPHeaders", headers={"Authorization": f"Basic {login}"})
        return context, page_call, self.events[sid]

    def close(self, context: str) -> None:
        """Close a browser context (its pages, cookies, storage and cache)."""
        self.call("Target.disposeBrowserContext", browserContextId=context)

    @contextlib.contextmanager
    def logged_in(
        self, user: str, password: str, events: list[dict] | None = None
    ) -> Iterator[Callable[..., dict]]:
        """:meth:`open` as a context manager, the context closed at its end: the page's
        ``call``; its events are appended to ``events`` (None: a list of its own)."""
        context, call, _ = self.open(user, password, events)
        try:
            yield call
        finally:
            self.close(context)


@contextlib.contextmanager
def _launched(profile: Path, flags: Sequence[str]) -> Iterator[Callable[[str], object]]:
    """A headless Chromium: ``get(name)``, its DevTools endpoint ``/json/<name>``."""
    port = free_port()
    argv = [
        str(CHROMIUM),
        *FLAGS,
        *flags,
        f"--remote-debugging-port={port}",
        f"--user-data-dir={profile}",
        "about:blank",
    ]
    proc = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:

        def get(name: str) -> object:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/{name}", timeout=2) as r:
                return json.load(r)

        deadline = time.monotonic() + 60
        while True:
            try:
                get("list")
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.2)
        yield get
    finally:
        stop_group(proc, grace=10)


@contextlib.contextmanager
def page_session(
    profile: Path, flags: Sequence[str] = (), events: list[dict] | None = None
) -> Iterator[Callable[..., dict]]:
    """A headless Chromium's blank page, driven over the DevTools protocol.

    Args:
        profile: A fresh Chromium profile folder.
        flags: Chromium flags besides :data:`FLAGS`.
        events: Where the events the page sends between answers are appended (``Network.*``
            once ``Network.enable`` was called); None drops them.

    Returns:
        A context manager giving ``call(method, **params) -> result`` (a DevTools command).
    """
    from websockets.sync.client import connect

    with devtools(profile, flags) as ws_url, connect(ws_url, max_size=None, open_timeout=30) as ws:
        ids = itertools.count(1)

        def call(method: str, **params) -> dict:
            sent = next(ids)
            ws.send(json.dumps({"id": sent, "method": method, "params": params}))
            while True:
                message = json.loads(ws.recv(timeout=30))
                if message.get("id") == sent:
                    return message.get("result", {})
                if events is not None and "method" in message:
                    events.append(message)

        yield call


@contextlib.contextmanager
def logged_in(
    profile: Path,
    user: str,
    password: str,
    flags: Sequence[str] = (),
    events: list[dict] | None = None,
) -> Iterator[Callable[..., dict]]:
    """:func:`page_session` sending ``user``'s basic-auth login with every request.

    Args:
        profile: A fresh Chromium profile folder.
        user: The user.
        password: Its password.
        flags: Chromium flags besides :data:`FLAGS`.
        events: Where the page's events are appended (:func:`page_session`).

    Returns:
        A context manager giving ``call(method, **params) -> result``.
    """
    with page_session(profile, flags, events) as call:
        login = base64.b64encode(f"{user}:{password}".encode()).decode()
        call("Network.enable")
        call("Network.setExtraHTTPHeaders", headers={"Authorization": f"Basic {login}"})
        yield call


def evaluate(call: Callable[..., dict], expression: str) -> object:
    """The value of a JavaScript ``expression`` in the page (None while a document loads)."""
    found = call("Runtime.evaluate", expression=expression, returnByValue=True)
    return found.get("result", {}).get("value")
