"""``GET /``: the chat page, one static file (``static/index.html``: its style and script inline, no build
step, nothing fetched from elsewhere), read once and served as it is.

The page calls the API of the same origin with the tenant and key the user entered (kept in the browser's
localStorage, sent as headers, never in a URL). Its Content-Security-Policy allows only the page's own
inline style and script (by their SHA-256, so no injected script runs) and connections to this origin.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import re
from importlib import resources

from fastapi.responses import HTMLResponse

PAGE = "index.html"
NONE = "'none'"
_INLINE = re.compile(r"<(script|style)>(.*?)</\1>", re.S)  # the page's inline blocks, attribute-free


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def policy(html: str) -> str:
    """The Content-Security-Policy of ``html``: its own inline script and style, connections to this origin."""
    blocks: dict[str, list[str]] = {"script": [], "style": []}
    for kind, body in _INLINE.findall(html):
        blocks[kind].append(_sha256(body))
    script, style = (" ".join(blocks[kind]) or NONE for kind in ("script", "style"))
    return "; ".join((f"default-src {NONE}", f"script-src {script}", f"style-src {style}", "connect-src 'self'",
                      "img-src 'self' data:", f"base-uri {NONE}", f"form-action {NONE}", f"frame-ancestors {NONE}"))


@functools.cache
def page_text() -> str:
    return resources.files(__package__).joinpath("static", PAGE).read_text(encoding="utf-8")


def response() -> HTMLResponse:
    html = page_text()
    return HTMLResponse(html, headers={
        "content-security-policy": policy(html), "x-content-type-options": "nosniff",
        "referrer-policy": "no-referrer", "cache-control": "no-cache",
    })
