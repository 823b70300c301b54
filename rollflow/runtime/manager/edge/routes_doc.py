"""The manager's routes, as the HTTP reference shows them (see rollflow/runtime/http/route_docs.py).

With `token:` set, admin and trainer routes (worker changes, `/batches...`, `POST /step_report`,
`abort_all`, the fan-out routes) need `Authorization: Bearer TOKEN`; errors are JSON
`{"error": MESSAGE}` with a 4xx naming what is wrong.
"""

from __future__ import annotations

from rollflow.runtime.http.route_docs import RouteDoc

ROUTES: dict[str, RouteDoc] = {
    # SGLang's native API, as sgl-router serves it
    "POST /generate": RouteDoc(
        "SGLang's `/generate` body: `input_ids` (or `text` when `tokenizer:` is set), `sampling_params`, "
        "`stream`, `return_logprob`, `rid`; a list of prompts answers a list",
        "SGLang's answer; `meta_info` adds `spans` (engine, weight version, attempt, token range) and "
        "`resumes`; a sample whose engine dies is resumed elsewhere from its tokens",
    ),
    "POST /abort_request": RouteDoc(
        '`{"rid"}` (a `/generate` rid, or a batch sample id: token) or `{"abort_all": true}` (token)',
        '200; the sample ends with `finish_reason: {"type": "abort", "message"}` and the tokens it has',
    ),
    "GET /v1/loads": RouteDoc(
        "-",
        '`{"timestamp", "total_workers", "successful", "failed", "num_waiting_reqs", "num_running_reqs", '
        '"loads": [{"worker", "num_running_reqs", ...}]}` (sgl-router\'s aggregate; the manager\'s own '
        "queue is `num_waiting_reqs`)",
    ),
    "GET /get_load": RouteDoc("-", '`[{"worker", "num_reqs", "num_waiting_reqs"}]`, one per engine'),
    "GET /get_model_info": RouteDoc("-", "the first live engine's answer, relayed"),
    "GET /get_server_info": RouteDoc("-", "the first live engine's answer, relayed"),
    "GET /v1/models": RouteDoc("-", "the first live engine's answer, relayed"),
    "GET /health_generate": RouteDoc(
        "-", "200 when every live engine generates a token, else 503 naming the ones that did not"
    ),
    "POST /flush_cache": RouteDoc(
        "the body is sent to every live engine (token)",
        "200 only if all succeeded, else the engines' 4xx or a 502 naming each failed engine and why",
    ),
    "POST /pause_generation": RouteDoc(
        '`{"mode"}`, sent to every live engine (token)', "as `POST /flush_cache`"
    ),
    "POST /continue_generation": RouteDoc("sent to every live engine (token)", "as `POST /flush_cache`"),
    "POST /update_weights_from_disk": RouteDoc(
        '`{"model_path", "weight_version"}`, sent to every live engine (token)',
        "as `POST /flush_cache`, plus `weight_versions` (engine id -> version read back from each "
        "engine; routing uses it at once)",
    ),
    # engines: sgl-router's worker API
    "POST /workers": RouteDoc(
        '`{"url", "worker_type": "regular", "bootstrap_port": null, "api_key"?, "kind": "local" | "remote" '
        '| "spot", "engine_type": "sglang" | "vllm" | "builtin", "capacity"}` (token)',
        "the engine's record (201); prefill/decode workers are refused with a message; a url already "
        "registered is the same engine",
    ),
    "GET /workers": RouteDoc(
        "query `include_failed=true`, `include_removed=true`",
        "the live engines: id, url, kind, state, weight version, load, `prefix_hit_rate`, ...",
    ),
    "DELETE /workers/{engine_id}": RouteDoc(
        "- (token)", "200; its running samples resume on the other engines from their tokens"
    ),
    "POST /add_worker": RouteDoc(
        "query `url=` and any `POST /workers` field (token)",
        "200 `Successfully added worker: URL` (text, as sgl-router and vllm-router answer); 400 naming why not",
    ),
    "POST /remove_worker": RouteDoc(
        "query `url=` (token)", "200 `Successfully removed worker: URL` (text); 404 for a url not registered"
    ),
    "GET /list_workers": RouteDoc("-", '`{"urls": [...]}` of the live engines'),
    "POST /workers/{engine_id}/update_weights": RouteDoc(
        '`{"model_path", "weight_version"}` (token)',
        "200 once loaded; the engine is held out of the pool while loading and rejoins only on that version",
    ),
    "POST /workers/{engine_id}/release": RouteDoc(
        "- (token)",
        "200 with `move` (samples moved, how long it took) once the engine is drained and has freed its "
        "memory (state `released`); 409 when the engine refuses, 502 when it dies meanwhile",
    ),
    "POST /workers/{engine_id}/resume": RouteDoc(
        '`{}`, or `{"weights_url", "weight_version"?}`, or `{"model_path", "weight_version"}` (token)',
        "200 once the engine is awake (on that version) and back in routing",
    ),
    "POST /release_memory_occupation": RouteDoc(
        "- (token)", "releases every healthy engine (what sgl-router fans out)"
    ),
    "POST /resume_memory_occupation": RouteDoc("- (token)", "wakes every released engine"),
    "GET /weight_versions": RouteDoc("-", "`{engine_id: weight_version}`"),
    # the trainer's API
    "POST /batches": RouteDoc(
        '`{"prompts": [[ids]], "n", "sampling_params", "allow_off_policy", "batch_id"?}` (token)',
        '`{"batch_id"}`; a `batch_id` already known answers that batch (a repeated submission makes none)',
    ),
    "GET /batches/{batch_id}": RouteDoc("-", "the batch's sample counts by state"),
    "POST /batches/{batch_id}/next": RouteDoc(
        '`{"min_groups", "max_groups", "timeout_s", "micro_batch"?, "received"?}` (token)',
        "the next micro-batch of whole groups (`micro_batch: k` asks for the k-th again); 410 after a cancel",
    ),
    "POST /batches/{batch_id}/flush": RouteDoc("- (token)", "the finished groups ready now"),
    "GET /batches/{batch_id}/samples": RouteDoc(
        "query `order=completion | submission`, `after=N` (or `Last-Event-ID: N`)",
        "an NDJSON stream of finished samples after the N lines seen; 410 after a cancel",
    ),
    "DELETE /batches/{batch_id}": RouteDoc(
        "- (token)", "cancels it: a waiting `next` answers 410, sample streams end with an error line"
    ),
    "POST /step_report": RouteDoc(
        '`{"step_time_s", "bubble_s", "rollout_s"?}` (token)', "the next local budget (offload balancer)"
    ),
    "GET /step_report": RouteDoc("-", '`{"steps", "last"}`: steps reported and the last report'),
    # OpenAI
    "POST /v1/completions": RouteDoc(
        "OpenAI's completions body; needs `tokenizer:`",
        "OpenAI's answer or SSE chunks; one manager sample, resumed elsewhere if its engine dies",
    ),
    "POST /v1/chat/completions": RouteDoc(
        "OpenAI's chat body, through the tokenizer's chat template; needs `tokenizer:`",
        "OpenAI's answer or SSE chunks",
    ),
    # vLLM's router API, as vllm-router serves it (vllm_api.py)
    "POST /inference/v1/generate": RouteDoc(
        'vLLM\'s token-in/token-out body: `{"token_ids", "sampling_params", "model"?, "stream"?, '
        '"stream_options"?}` (vLLM\'s sampling fields; `n` up to 64, `logprobs` 0 or 1); `X-Session-ID` '
        "header (or `session_id`) keeps a session's requests on one engine",
        '`{"request_id", "model", "choices": [{"index", "token_ids", "finish_reason", "logprobs": '
        '{"content": [{"token", "logprob", "bytes", "top_logprobs": []}]} | null}], "prompt_logprobs": null}`; '
        'with `stream: true`, vLLM\'s SSE: an event per choice with new tokens, `{"request_id", "choices": '
        "[that choice, its new `token_ids` and `logprobs`]}`, the usage event if `stream_options.include_usage`, "
        '`data: [DONE]`; errors `{"error": {"message", "type", "param", "code"}}` (an event, once streaming)',
    ),
    "POST /v1/chat/completions/render": RouteDoc(
        "OpenAI's chat body, as `/v1/chat/completions` takes it (text only); needs `tokenizer:`",
        'vLLM\'s render: the `/inference/v1/generate` body that answers it, `{"request_id", "token_ids" '
        '(through the chat template), "features": null, "sampling_params" (vLLM\'s names), "model", "stream", '
        '"stream_options", "cache_salt": null, "priority": 0}`',
    ),
    "POST /finish_session": RouteDoc(
        "`?session_id=ID`: the session's requests are done",
        '`{"status": "ok", "session_id"}`; its engine is no longer kept for it',
    ),
    "POST /tokenize": RouteDoc(
        '`{"prompt", "add_special_tokens"?, "return_token_strs"?, "model"?}`; needs `tokenizer:`',
        '`{"count", "max_model_len" (the manager\'s max_prompt_tokens), "tokens", "token_strs"}`',
    ),
    "POST /detokenize": RouteDoc('`{"tokens", "model"?}`; needs `tokenizer:`', '`{"prompt"}`'),
    # vLLM's server control routes, as SkyRL's proxy-only mode sends them to the router (vllm_control.py)
    "POST /pause": RouteDoc(
        "query `mode=keep|abort|wait` (keep by default), `clear_cache=true|false` (token)",
        '`{"status": "paused", "mode", "samples_moved"}` once no engine runs a sample; nothing is routed '
        "until `/resume`. keep and abort move the running samples back to the queue with their tokens "
        "(they go on from them after `/resume`; none is aborted), wait lets them finish first",
    ),
    "POST /resume": RouteDoc("- (token)", '`{"status": "resumed"}`; the waiting samples are routed again'),
    "GET /is_paused": RouteDoc("-", '`{"is_paused": bool}`'),
    "POST /sleep": RouteDoc(
        "query `level=1|2`, `tags=weights|kv_cache` (token)",
        '`{"status": "ok", "moves"}`: every healthy engine drained and its memory freed (any level or tags '
        'free the whole engine, as `POST /release_memory_occupation`); 502 `{"error"}` naming the engines '
        "that did not",
    ),
    "POST /wake_up": RouteDoc(
        "query `tags=weights|kv_cache` (token)",
        '`{"status": "ok", "moves"}`: every released engine woken on the weights it held (any tags wake '
        "the whole engine)",
    ),
    "POST /reset_prefix_cache": RouteDoc(
        '`{"reset_running_requests"?}` (token)',
        "every live engine forgets its cached prefixes (vLLM's `/reset_prefix_cache`, SGLang's and the "
        "built-in engine's `/flush_cache`); answered as `POST /flush_cache`",
    ),
    "GET /get_world_size": RouteDoc("-", "501 naming it: the manager joins no weight-transfer group"),
    "POST /init_weight_transfer_engine": RouteDoc(
        "-", "501: load weights through `POST /workers/{id}/update_weights` instead"
    ),
    "POST /update_weights": RouteDoc(
        'prime-rl\'s `{"weight_dir", "weight_version"?}` (token)',
        '`{"status": "ok", "weight_version", "engines"}` once every healthy engine has loaded the folder '
        "(each held out of the pool while it loads, as `POST /workers/{id}/update_weights`; the version "
        "is one above the newest served unless given); vLLM's `update_info` body is a 501",
    ),
    "POST /start_weight_update": RouteDoc("-", "501, as `POST /init_weight_transfer_engine`"),
    "POST /finish_weight_update": RouteDoc("-", "501, as `POST /init_weight_transfer_engine`"),
    "POST /collective_rpc": RouteDoc("-", "501, as `POST /init_weight_transfer_engine`"),
    "POST /init_broadcaster": RouteDoc(
        "-", "501, as `POST /init_weight_transfer_engine` (prime-rl's NCCL mode)"
    ),
    "POST /load_lora_adapter": RouteDoc("-", "501, as `POST /skyrl/v1/load_lora_adapter`"),
    "POST /skyrl/v1/load_lora_adapter": RouteDoc("-", "501: the engines serve one model, no LoRA adapter"),
    "POST /v1/load_lora_adapter": RouteDoc("-", "501, as `POST /skyrl/v1/load_lora_adapter`"),
    "POST /v1/unload_lora_adapter": RouteDoc("-", "501, as `POST /skyrl/v1/load_lora_adapter`"),
    "POST /skyrl/v1/generate": RouteDoc(
        "-",
        "501: routed-expert replay needs MoE routing decisions, which no engine behind the manager reports",
    ),
    # multi-turn sessions
    "POST /v1/sessions": RouteDoc(
        '`{"session_id"?, "weight_version"?, "allow_off_policy"?}`',
        "201 with the session id (the same open sent again answers 200 with it)",
    ),
    "POST /v1/sessions/{session_id}/turns": RouteDoc(
        '`{"input_ids", "sampling_params", "return_logprob"?, "rid"?}` (the first turn\'s ids are the '
        "prompt, a later turn's the environment's tokens)",
        "`output_ids`, SGLang's `meta_info` (`cached_tokens`, `spans`, `weight_version`, `resumes`) and "
        "`context_length`; the same `rid` answers the same turn, other input with it is a 409",
    ),
    "GET /v1/sessions/{session_id}": RouteDoc(
        "- (token)",
        "`context_ids`, `logprobs`, `loss_mask`, `segments` (prompt / output / env, by turn), `turns`",
    ),
    "DELETE /v1/sessions/{session_id}": RouteDoc(
        "- (token)", "closes it (a turn in flight is cancelled); the context"
    ),
    "POST /open_session": RouteDoc(
        'SGLang\'s `{"capacity_of_str_len", "session_id"?}`', "the session id as a JSON string"
    ),
    "POST /close_session": RouteDoc('SGLang\'s `{"session_id"}` (token)', "an empty 200"),
    # operations
    "GET /metrics": RouteDoc("-", "Prometheus text; see the [metrics reference](metrics.md)"),
    "GET /health": RouteDoc("-", '`{"status": "ok"}` while the manager runs'),
}
