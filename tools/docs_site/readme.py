"""The README's results table, between its two markers, rendered from the results files.

    .venv/bin/python -m tools.docs_site.readme --write   # after a benchmark wrote its results file

The README is read on GitHub and PyPI, where nothing runs at build time, so the table is committed;
`tests/docs/test_site.py` fails when it differs from what the results files give.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from tools.docs_site.benchmarks_page import REPO, readme_table

BEGIN = "<!-- results-table: begin (python -m tools.docs_site.readme --write renders it) -->"
END = "<!-- results-table: end -->"
BLOCK = re.compile(re.escape(BEGIN) + r"\n.*?" + re.escape(END), re.DOTALL)


def render(text: str, root: Path = REPO) -> str:
    """`text` with the table between the markers rendered anew."""
    if not BLOCK.search(text):
        raise ValueError(f"README.md has no results table markers ({BEGIN} ... {END})")
    return BLOCK.sub(lambda _: f"{BEGIN}\n{readme_table(root)}{END}", text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite README.md's table in place")
    args = parser.parse_args()
    readme = REPO / "README.md"
    text = readme.read_text()
    new = render(text)
    if args.write:
        readme.write_text(new)
        return 0
    if new != text:
        print("README.md's results table is stale: run .venv/bin/python -m tools.docs_site.readme --write")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
