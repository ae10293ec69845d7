"""Pages a browser opens straight from the model store: `pages/<kind>/<name>.html`.

Blobs are named by their sha256 with no extension, so a browser shows a stored HTML blob as
text (Chromium does for file:// URLs). The impact history and the reports it links to are
therefore also written once under a key ending in `.html`. The key lies outside `blobs/`, so
store gc (which only deletes unreferenced blobs) never removes a page; the blob and attachment
stay the record, the page is the readable copy.
"""

from __future__ import annotations

from model_store import ModelStore

PAGES = "pages"


def publish_page(store: ModelStore, kind: str, name: str, html: str) -> str:
    """Write a page once under pages/<kind>/<name>.html; its address (the same on a rewrite)."""
    for part in (kind, name):
        if not part or "/" in part or part.startswith("."):
            raise ValueError(f"invalid page name part {part!r}: non-empty, no '/', no leading '.'")
    key = f"{PAGES}/{kind}/{name}.html"
    store.backend.put_bytes(key, html.encode(), exclusive=True)  # first writer wins
    return store.backend.locate(key)
