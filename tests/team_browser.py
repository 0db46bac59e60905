"""A member's browser on their laptop: headless Chromium, logged in to MLflow, opens pages one
after the other and reports what each shows and how MLflow answered the page's requests.

Chromium runs where this module runs — the tests start it in the laptop's network namespace
(``ip netns exec <tag>-laptop python -m tests.team_browser SESSION``), so its DevTools port is the
laptop's loopback and every page it opens is reached over the laptop's network. The login is sent
as MLflow's basic-auth header with every request (:meth:`tests.chromium.Contexts.open`), as a browser
does once its user typed the login into the prompt.

One Chromium serves every member the test lets browse, each in a browser context of its own
(``Target.createBrowserContext``: its own cookies, storage, cache and HTTP logins, as a separate
profile has), so a module starts the browser once (a launch costs ~1 CPU-s) and each member's
pages still share nothing with another's.

SESSION is a JSON object: ``profile`` (a fresh folder), ``flags`` (more Chromium flags, e.g. the
test certificate's SPKI pin). Each line of standard input is a JSON object: ``{"login": [user,
password]}`` opens a new browser context with a blank page logged in as ``user`` (the last one
is closed first) and prints ``{"context": id}``; ``{"end": true}`` closes the context and prints
``{"ended": id}``; any other line is a page to open in the context, a JSON object: ``url``,
``screenshot`` (a PNG path or empty), ``until`` (texts that must all be shown), ``answered``
(the API requests the test asks about: each a path fragment or a GraphQL operation name, e.g.
``/runs/search`` or ``GetRun``, that an answered request must have), ``timeout`` (seconds). Each
page is a whole new document (the browser leaves the last one for ``about:blank`` first),
reported on its own. A page is settled when every ``until`` text is shown, nothing is drawn as
loading (``aria-busy``), MLflow answered every ``answered`` request (and at least one of the UI's
API requests), and none has been pending for :data:`QUIET_S`. The quiet time alone is no sign
that the page asked all it will ask: the UI asks for the run, or the runs list, only once it has
drawn what the first answers (server info, workspaces, the user) tell it, seconds later on a
loaded machine (2.1–2.3 s of nothing pending measured here), so a test that reads an answer
names it in ``answered``. For each page it prints one JSON line: ``text``
(``document.body.innerText`` then, or at the timeout), ``title``, ``href``, ``settled``,
``errors`` (MLflow's error notices in the text) and ``api`` (``[method, path and query, status,
the answer's first :data:`BODY_CHARS`]`` of each of the UI's API requests, status 0 for one that
got no answer). End of input ends the browser.
"""

from __future__ import annotations

import base64
import json
import sys
import time
import urllib.parse
from pathlib import Path

from tests.chromium import browser_contexts, evaluate

#: what the page shows now; ``busy``: a table or list still loading
STATE = """JSON.stringify({
    title: document.title,
    href: location.href,
    text: document.body ? document.body.innerText : "",
    busy: document.querySelector('[aria-busy="true"]') !== null,
})"""
#: MLflow's notices when a request of the page failed (a refused XHR, a 403 on the runs search)
ERROR_TEXTS = ("Request error", "Failed to load", "INTERNAL_ERROR", "Invalid Host header")
#: the UI's calls of MLflow's API (not its scripts, styles and images)
API_PREFIXES = ("/ajax-api/", "/api/", "/graphql")
#: seconds without a pending API request before a page counts as settled
QUIET_S = 2.0
#: how much of each answer is reported (enough for a few runs' search)
BODY_CHARS = 50_000


class Requests:
    """The UI's API requests, from the DevTools ``Network`` events."""

    def __init__(self) -> None:
        self.sent: dict[str, tuple[str, str]] = {}
        self.status: dict[str, int] = {}
        self.operation: dict[str, str] = {}
        self.open: set[str] = set()
        self.last_change = time.monotonic()

    def take(self, events: list[dict]) -> None:
        """Read (and empty) ``events``."""
        for event in events:
            params = event.get("params", {})
            rid = params.get("requestId")
            method = event["method"]
            if method == "Network.requestWillBeSent":
                url = urllib.parse.urlsplit(params["request"]["url"])
                if url.path.startswith(API_PREFIXES) and rid not in self.sent:
                    self.sent[rid] = (params["request"]["method"], url.path + "?" + url.query)
                    self.operation[rid] = _operation(params["request"].get("postData"))
                    self.open.add(rid)
                    self.last_change = time.monotonic()
            elif rid in self.sent and method == "Network.responseReceived":
                self.status[rid] = int(params["response"]["status"])
            elif rid in self.sent and method in (
                "Network.loadingFinished",
                "Network.loadingFailed",
            ):
                self.open.discard(rid)
                self.last_change = time.monotonic()
        events.clear()

    def quiet(self) -> bool:
        """At least one answer in, none pending for :data:`QUIET_S`."""
        return (
            bool(self.status) and not self.open and time.monotonic() - self.last_change >= QUIET_S
        )

    def answered(self, wanted: list[str]) -> bool:
        """Whether each of ``wanted`` (a path fragment or a GraphQL operation name) is in the
        path or the operation of a request whose answer is all in."""
        done = [
            (self.sent[rid][1], self.operation[rid]) for rid in self.status if rid not in self.open
        ]
        return all(any(w in path or w == op for path, op in done) for w in wanted)

    def answers(self, call) -> list[list]:
        """``[method, path?query, status, the answer (its first :data:`BODY_CHARS`)]`` of each."""
        out = []
        for rid, sent in self.sent.items():
            body = "" if rid in self.open else call("Network.getResponseBody", requestId=rid)
            text = body.get("body", "") if isinstance(body, dict) else ""
            if isinstance(body, dict) and body.get("base64Encoded"):
                text = base64.b64decode(text).decode(errors="replace")
            out.append([*sent, self.status.get(rid, 0), text[:BODY_CHARS]])
        return out


def _operation(posted: str | None) -> str:
    """The GraphQL ``operationName`` of a request's body, or ``""``."""
    try:
        found = json.loads(posted or "")
    except ValueError:
        return ""
    return str(found.get("operationName") or "") if isinstance(found, dict) else ""


def look(call, events: list[dict], page: dict) -> dict:
    """Open ``page["url"]`` in the session's page and wait until it settles (module docstring).

    Args:
        call: the page's DevTools ``call``.
        events: where the page's events arrive (read and emptied here).
        page: the page to open.

    Returns:
        What the page showed and how its API requests were answered.
    """
    until = list(page.get("until", ()))
    wanted = list(page.get("answered", ()))
    events.clear()
    requests = Requests()
    call("Page.navigate", url=page["url"])
    state: dict = {}
    settled = False
    deadline = time.monotonic() + float(page.get("timeout", 90))
    while time.monotonic() < deadline:
        value = evaluate(call, STATE)  # None while a document replaces another
        state = json.loads(value) if isinstance(value, str) else state
        requests.take(events)
        text = state.get("text", "")
        shown = text and not state.get("busy") and all(t in text for t in until)
        if shown and requests.answered(wanted) and requests.quiet():
            settled = True
            break
        time.sleep(0.5)
    if page.get("screenshot"):
        shot = call("Page.captureScreenshot", format="png")
        Path(page["screenshot"]).write_bytes(base64.b64decode(shot["data"]))
    api = requests.answers(call)
    text = state.get("text", "")
    return {
        "text": text,
        "title": state.get("title", ""),
        "href": state.get("href", ""),
        "settled": settled,
        "errors": [e for e in ERROR_TEXTS if e in text],
        "api": api,
    }


def leave(call, events: list[dict]) -> None:
    """Replace the page's document with ``about:blank`` (the next page is a new document)."""
    call("Page.navigate", url="about:blank")
    deadline = time.monotonic() + 30
    while evaluate(call, "location.href") != "about:blank" and time.monotonic() < deadline:
        time.sleep(0.1)
    events.clear()


def main(argv: list[str]) -> int:
    session = json.loads(argv[1])
    profile = Path(session["profile"])
    with browser_contexts(profile, session.get("flags", ())) as contexts:
        context, call, events, pages = "", None, [], 0
        for line in sys.stdin:
            asked = json.loads(line)
            if "login" in asked or asked.get("end"):
                if context:
                    contexts.close(context)
                ended, context, pages = context, "", 0
                if "login" in asked:
                    context, call, events = contexts.open(*asked["login"])
                    print(json.dumps({"context": context}), flush=True)
                else:
                    print(json.dumps({"ended": ended}), flush=True)
                continue
            if pages:
                leave(call, events)
            pages += 1
            print(json.dumps(look(call, events, asked)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
