"""The built-in engine's routes, as the HTTP reference shows them (see rollflow/runtime/http/route_docs.py).

Bodies and answers are SGLang's unless marked rollflow's own; with `--api-key` every route but
`/health` needs `Authorization: Bearer KEY`.
"""

from __future__ import annotations

from rollflow.runtime.http.route_docs import RouteDoc

ROUTES: dict[str, RouteDoc] = {
    "POST /generate": RouteDoc(
        '`{"input_ids" | "text", "sampling_params": {"max_new_tokens", "temperature", "top_p", "top_k", '
        '"min_p", "stop", "stop_token_ids", "sampling_seed", "ignore_eos", ...}, "stream", '
        '"return_logprob", "rid"}`; a list of prompts is answered with a list',
        '`{"text", "output_ids", "meta_info": {"finish_reason", "output_token_logprobs", "weight_version", '
        '"cached_tokens", ...}}`, or SSE `data:` events ending in `data: [DONE]` when streaming; 400 names '
        "a bad field, 503 while the memory is released",
    ),
    "POST /abort_request": RouteDoc(
        '`{"rid"}` or `{"abort_all": true}`',
        '`{"success": true}`; the request ends with `finish_reason: abort`',
    ),
    "GET /health": RouteDoc("-", "200 once the model is loaded (also while its memory is released)"),
    "GET /health_generate": RouteDoc("-", "200 after generating one token, else 503"),
    "GET /get_model_info": RouteDoc(
        "-",
        '`{"model_path", "tokenizer_path", "is_generation", "weight_version", "vocab_size", '
        '"max_context_length", "num_running_requests", "tp_size", "tp_pids"}` (`tp_pids`, rollflow\'s own: '
        "the processes of tensor-parallel ranks 1..N-1)",
    ),
    "GET /get_server_info": RouteDoc(
        "-", "how it was started, its weight version, its running requests, whether it is paused"
    ),
    "GET /get_weight_version": RouteDoc("-", '`{"weight_version"}`'),
    "GET /v1/loads": RouteDoc(
        "-",
        '`{"dp_rank_count": 1, "loads": [{"num_running_reqs", "num_waiting_reqs", "num_used_tokens", '
        '"max_total_num_tokens", "cache_hit_rate", "prefill_tokens_computed", ...}]}`',
    ),
    "GET /get_load": RouteDoc("-", '`[{"dp_rank": 0, "num_reqs", "num_waiting_reqs", "num_tokens"}]`'),
    "POST /update_weights_from_disk": RouteDoc(
        '`{"model_path", "weight_version"?, "abort_all_requests"?}`',
        '`{"success", "message"}`; running requests go on with the new weights from their next step',
    ),
    "POST /update_weights_from_safetensors": RouteDoc(
        "rollflow's own: a safetensors payload of some or all of the model's tensors; query `weight_version=N`",
        '`{"success", "message"}`; 400 names a tensor of the wrong name, shape or dtype',
    ),
    "POST /update_weights_from_server": RouteDoc(
        'rollflow\'s own: `{"url", "weight_version"?, "codec"?, "transport"?}` (a weight server; default its newest version)',
        '`{"success", "message", "weight_version", "pull"}` once the pulled version is loaded (with '
        "`--tensor-parallel`, every rank pulls its own slices and all load together; "
        "`pull.wire_nbytes_by_tp_rank` gives the bytes each rank read); 502 when the "
        "pull or a rank failed: the engine keeps its version",
    ),
    "POST /pause_generation": RouteDoc(
        '`{"mode": "abort" | "in_place" | "retract"}`', "200; no request makes progress until continued"
    ),
    "POST /continue_generation": RouteDoc("`{}`", "200; paused requests go on"),
    "POST /flush_cache": RouteDoc("-", "200; the prefix cache is emptied"),
    "POST /v1/completions": RouteDoc(
        "OpenAI's completions body (`prompt` as text or token ids, `max_tokens`, `temperature`, `stream`, ...)",
        "OpenAI's answer, or SSE chunks ending in `data: [DONE]`; a field that cannot be honoured is a 400 "
        'in OpenAI\'s error shape `{"error": {"message", "type", "param", "code"}}`',
    ),
    "POST /v1/chat/completions": RouteDoc(
        "OpenAI's chat body (`messages`, `max_completion_tokens`, `stream`, ...), through the model's chat template",
        "OpenAI's answer or SSE chunks; 400 when the tokenizer has no chat template",
    ),
    "GET /v1/models": RouteDoc("-", "OpenAI's model list: the one model served"),
    "POST /release_memory_occupation": RouteDoc(
        '`{"tags": ["weights", "kv_cache"] | null}`',
        '`{"success", ...}`; running requests are aborted, the model and caches freed; `/generate` is a 503 '
        "until resumed",
    ),
    "POST /resume_memory_occupation": RouteDoc(
        '`{"tags"?}`', "200 once the model is rebuilt at the version it served"
    ),
    "GET /is_sleeping": RouteDoc(
        "-", '`{"is_sleeping", "released_tags", "weights_bytes", "cached_sequences"}`'
    ),
}
