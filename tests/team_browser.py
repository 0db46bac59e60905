"""A member's browser on their laptop: headless Chromium opens one page, logged in to MLflow, and
reports what it shows.

Chromium runs where this module runs — the tests start it in the laptop's network namespace
(``ip netns exec <tag>-laptop python -m tests.team_browser REQUEST``), so its DevTools port is the
laptop's loopback and every page it opens is reached over the laptop's network. The login is sent
as MLflow's basic-auth header with every request (:func:`tests.chromium.logged_in`), as a browser
does once its user typed the login into the prompt.

REQUEST is a JSON object: ``url``, ``user``, ``password``, ``profile`` (a fresh folder),
``screenshot`` (a PNG path or empty), ``until`` (texts that must all be shown), ``timeout``
(seconds), ``flags`` (more Chromium flags, e.g. the test certificate's SPKI pin). It prints one
JSON line: ``text`` (``document.body.innerText`` when every ``until`` text is shown, or at the
timeout), ``title``, ``href``, ``shown`` (whether every ``until`` text was shown) and
``errors`` (MLflow's error notices on the page).
"""

from __future__ import annotations

import base64
import json
import sys
import time
from pathlib import Path

from tests.chromium import evaluate, logged_in

#: what the page shows now; ``busy``: a table or list still loading
STATE = """JSON.stringify({
    title: document.title,
    href: location.href,
    text: document.body ? document.body.innerText : "",
    busy: document.querySelector('[aria-busy="true"]') !== null,
})"""
#: MLflow's UI when a request of the page failed (a refused XHR, a 403 on the runs search)
ERROR_TEXTS = ("Request error", "Failed to load", "INTERNAL_ERROR", "Invalid Host header")


def look(request: dict) -> dict:
    """Open ``request["url"]`` and wait for the ``until`` texts (module docstring).

    Args:
        request: the request.

    Returns:
        What the page showed.
    """
    until = list(request.get("until", ()))
    with logged_in(
        Path(request["profile"]), request["user"], request["password"], request.get("flags", ())
    ) as call:
        call("Page.enable")
        call("Page.navigate", url=request["url"])
        state: dict = {}
        shown = False
        deadline = time.monotonic() + float(request.get("timeout", 90))
        while time.monotonic() < deadline:
            value = evaluate(call, STATE)  # None while a document replaces another
            state = json.loads(value) if isinstance(value, str) else state
            text = state.get("text", "")
            if text and not state.get("busy") and all(t in text for t in until):
                shown = True
                break
            time.sleep(0.5)
        if request.get("screenshot"):
            shot = call("Page.captureScreenshot", format="png")
            Path(request["screenshot"]).write_bytes(base64.b64decode(shot["data"]))
    text = state.get("text", "")
    return {
        "text": text,
        "title": state.get("title", ""),
        "href": state.get("href", ""),
        "shown": shown,
        "errors": [line for line in text.splitlines() if line.startswith(ERROR_TEXTS)],
    }


def main(argv: list[str]) -> int:
    print(json.dumps(look(json.loads(argv[1]))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
