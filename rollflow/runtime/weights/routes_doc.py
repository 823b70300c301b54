"""The weight server's routes, as the HTTP reference shows them (see rollflow/runtime/http/route_docs.py)."""

from __future__ import annotations

from rollflow.runtime.http.route_docs import RouteDoc

ROUTES: dict[str, RouteDoc] = {
    "GET /health": RouteDoc("-", '`{"ok": true}`'),
    "GET /healthz": RouteDoc("-", '`{"ok": true}` (the same, for probes that expect this name)'),
    "GET /v1/versions": RouteDoc(
        "query `newer_than=N` (wait for a version above N), `wait_s=S` (long-poll up to S, at most 300)",
        '`{"versions": [ints], "latest": int | null}`, as soon as a newer version exists or after `wait_s`',
    ),
    "PUT /v1/versions/{version}": RouteDoc(
        "a safetensors file of the model's tensors (its metadata may carry the small text files of the "
        "checkpoint); `Authorization: Bearer TOKEN`",
        "the version's manifest; 403 without the server's token (or with none set and no "
        "`--insecure-open-publish`), 413 above `--max-upload-gb`, 400 for a version outside the range",
    ),
    "GET /v1/manifest": RouteDoc(
        "query `version` (absent or `latest`: the newest), `codec` (`raw`, `zstd`, `int8+zstd`, "
        "`delta+zstd`, ...; default `zstd`), `base` (the version the puller holds, for delta codecs), "
        "`tp_size` and `tp_rank` (a tensor-parallel engine rank: the payload holds only its slices, "
        "rollflow/runtime/weights/slices.py)",
        "the manifest: tensor names, shapes, dtypes, the payload id and each chunk's size and xxh3-128 "
        "checksum; 404 for an unknown version",
    ),
    "GET /v1/payloads/{payload_id}/chunks/{index}": RouteDoc(
        "-", "the chunk's bytes (checked by the puller against the manifest); 404 when absent"
    ),
    "GET /v1/payloads/{payload_id}/mooncake": RouteDoc(
        "-",
        '`{"session": "host:port", "chunks": [{"index", "address", "nbytes"}]}`: where the chunks lie in '
        "memory registered with the server's Mooncake engine (copied there on first ask); 409 when the "
        "server serves no Mooncake (started without `--mooncake`, or its engine did not start), 404 when "
        "the payload is absent",
    ),
    "PUT /v1/sharded/{version}": RouteDoc(
        "a sharded manifest (JSON): a version the FSDP trainer ranks hold in their Mooncake memory, "
        "which tensor rows each rank holds at which address; `Authorization: Bearer TOKEN`",
        '`{"version", "tensors"}`; 400 for a body that is not a sharded manifest or names another '
        "version, 401 without the token, 413 above 256 MiB; a manifest of a held version replaces it",
    ),
    "GET /v1/sharded/{version}": RouteDoc(
        "`{version}`: a number or `latest`",
        "the sharded manifest (engines then read the rows from the ranks, not from this server); 404 "
        "when no trainer ranks hold the version",
    ),
}
