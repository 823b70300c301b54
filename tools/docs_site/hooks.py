"""The MkDocs hook that adds the generated pages to the build (mkdocs.yml: `hooks:`).

The reference pages and the benchmarks page are made from the code and the results files each time
the site is built, in memory: none is committed, so none can go stale, and `mkdocs build --strict`
checks their links like any other page's.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # mkdocs loads this file by path; the generators import as tools.docs_site
    sys.path.insert(0, str(REPO))

from mkdocs.structure.files import File, Files  # noqa: E402

from tools.docs_site import (  # noqa: E402
    benchmarks_page,
    cli_reference,
    config_reference,
    http_reference,
    metrics_reference,
)

GENERATED = {
    "reference/cli.md": cli_reference.page,
    "reference/config.md": config_reference.page,
    "reference/http.md": http_reference.page,
    "reference/metrics.md": metrics_reference.page,
    "benchmarks/index.md": benchmarks_page.page,
}


def on_files(files: Files, config) -> Files:
    for path, render in GENERATED.items():
        if files.get_file_from_path(path) is not None:
            raise RuntimeError(f"docs/{path} is generated at build time: remove the file")
        files.append(File.generated(config, path, content=render()))
    return files
