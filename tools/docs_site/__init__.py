"""The documentation site's generated pages: the reference (CLI, config, HTTP, metrics) read from
the code and the benchmarks page read from the results files, added to the MkDocs build by
`hooks.py` so that no generated page is committed and none can go stale."""
