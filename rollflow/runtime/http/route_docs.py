"""What a documented HTTP route takes and answers, for the generated HTTP reference.

Each server keeps a `ROUTES` table beside its routes (`rollflow/runtime/**/routes_doc.py`), keyed
`"METHOD /path"` as aiohttp registers it; `tests/docs/test_routes_documented.py` fails when a
registered route has no entry or an entry names no registered route, so the reference cannot miss
a route or list one that is gone.
"""

from __future__ import annotations

from typing import NamedTuple


class RouteDoc(NamedTuple):
    request: str
    """The body or query it takes (`-` for none); JSON unless it says otherwise."""
    answer: str
    """What a success answers, and the errors a client should expect."""
