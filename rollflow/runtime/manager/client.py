"""A trainer's view of the manager: submit a batch, iterate over micro-batches of finished groups.

Blocking and dependency-free (urllib), because trainers are synchronous loops:

    client = ManagerClient("http://127.0.0.1:30100")
    batch = client.submit(prompts, n=8, max_new_tokens=256, temperature=1.0)
    for groups in batch.micro_batches(min_groups=4):
        train_on(groups)          # each group: the n samples (dicts) of one prompt

A manager that restarts from its journal is waited for (up to `reconnect_s`) once the client has
reached it: calls that are safe to repeat are repeated, and a batch's micro-batches and sample
stream carry on where they were, none handed out twice.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

from rollflow.errors import UserError


class ManagerError(RuntimeError):
    """The manager refused a request; the message is the manager's own explanation."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"manager answered {status}: {message}")
        self.status = status


class ManagerUnreachable(UserError):
    """No manager answers at the client's url (a wrong url, or the manager is down)."""


class _Disconnected(Exception):
    """No answer: `sent` when the manager may have acted on the request before it went away."""

    def __init__(self, reason: object, sent: bool) -> None:
        # "connection refused", not "[Errno 111] Connection refused"
        errno = reason.errno if isinstance(reason, OSError) else None
        super().__init__(os.strerror(errno).lower() if errno else str(reason))
        self.sent = sent


log = logging.getLogger(__name__)
RETRY_PAUSE_S = (0.1, 2.0)
"""First and longest pause between tries to reach a manager that went away (doubling in between)."""


def _given(**fields: Any) -> dict[str, Any]:
    """The optional fields of a request body that the caller set (None leaves one out, so the
    manager applies its own default)."""
    return {name: value for name, value in fields.items() if value is not None}


class ManagerClient:
    def __init__(
        self, url: str, token: str | None = None, timeout_s: float = 3600.0, reconnect_s: float = 120.0
    ) -> None:
        """`reconnect_s`: how long to wait for a manager that went away (a restart) before giving up."""
        self.url = url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s
        self.reconnect_s = reconnect_s
        self._reached = False  # a wrong url fails at once; a manager reached before is waited for

    def request(self, method: str, path: str, body: Any = None, idempotent: bool | None = None) -> Any:
        """`idempotent` (default: GET only): the call may be repeated when the manager went away
        after it was sent."""
        return json.loads(self._send(method, path, body, idempotent))

    def metrics(self) -> dict[str, float]:
        """The manager's Prometheus counters and gauges, each summed over its labels."""
        from prometheus_client.parser import text_string_to_metric_families

        totals: dict[str, float] = {}
        for family in text_string_to_metric_families(self._send("GET", "/metrics").decode()):
            for sample in family.samples:
                totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
        return totals

    def _send(self, method: str, path: str, body: Any = None, idempotent: bool | None = None) -> bytes:
        return self._retrying(lambda: self._send_once(method, path, body), idempotent or method == "GET")

    def _retrying(self, call, idempotent: bool):
        """`call()`, tried again while a manager that was reached before is away, for `reconnect_s`
        at most; a call that is not idempotent is tried again only if it never reached the manager."""
        deadline = None
        pause = RETRY_PAUSE_S[0]
        while True:
            try:
                result = call()
                self._reached = True
                return result
            except _Disconnected as exc:
                if not self._reached:
                    raise ManagerUnreachable(
                        f"cannot reach the manager at {self.url}: {exc}; start one (`rollflow manager serve`) "
                        "or point manager_url ($ROLLFLOW_MANAGER_URL) at a running one"
                    ) from None
                if not self.reconnect_s or (exc.sent and not idempotent):
                    raise ManagerUnreachable(f"cannot reach the manager at {self.url}: {exc}") from None
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self.reconnect_s
                    log.warning(
                        "the manager at %s went away (%s); waiting for it to come back", self.url, exc
                    )
                if now >= deadline:
                    raise ManagerUnreachable(
                        f"the manager at {self.url} did not come back within {self.reconnect_s:g}s "
                        f"(reconnect_s); last error: {exc}"
                    ) from None
                time.sleep(min(pause, max(0.0, deadline - now)))
                pause = min(2 * pause, RETRY_PAUSE_S[1])

    def _open(self, method: str, path: str, body: Any = None):
        """The manager's response, open; ManagerError for a 4xx/5xx, _Disconnected when none came."""
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            return urllib.request.urlopen(req, timeout=self.timeout_s)
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                message = json.loads(raw)["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = raw.decode(errors="replace")
            raise ManagerError(exc.code, message) from None
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, TimeoutError):
                raise self._silent() from None
            refused = isinstance(exc.reason, ConnectionRefusedError)
            raise _Disconnected(exc.reason, sent=not refused) from None
        except TimeoutError:  # sent, then no status line in time (urlopen lets this one through)
            raise self._silent() from None
        except (http.client.HTTPException, ConnectionError) as exc:
            raise _Disconnected(exc or type(exc).__name__, sent=True) from None

    def _send_once(self, method: str, path: str, body: Any = None) -> bytes:
        with self._open(method, path, body) as response:
            try:
                return response.read()
            except TimeoutError:
                raise self._silent() from None
            except (http.client.HTTPException, ConnectionError) as exc:
                raise _Disconnected(exc or type(exc).__name__, sent=True) from None

    def _silent(self) -> ManagerUnreachable:
        """A manager that took the request and then said nothing for `timeout_s` (socket's own
        TimeoutError says neither which server nor which limit)."""
        return ManagerUnreachable(
            f"the manager at {self.url} answered nothing within {self.timeout_s:g}s (timeout_s)"
        )

    def submit(
        self, prompts: list[list[int]], n: int = 1, allow_off_policy: bool = False, **sampling_params: Any
    ) -> BatchHandle:
        """Submit prompts x n samples; `sampling_params` are SGLang's (max_new_tokens, temperature, ...).

        The batch id is the client's, so a submission repeated across a manager restart finds its batch."""
        status = self.request(
            "POST",
            "/batches",
            {
                "prompts": prompts,
                "n": n,
                "sampling_params": sampling_params,
                "allow_off_policy": allow_off_policy,
                "batch_id": uuid.uuid4().hex[:12],
            },
            idempotent=True,
        )
        return BatchHandle(self, status["batch_id"], status["num_groups"], status["num_samples"])

    def generate(self, input_ids: list[int], return_logprob: bool = True, **sampling_params: Any) -> dict:
        body = {"input_ids": input_ids, "sampling_params": sampling_params, "return_logprob": return_logprob}
        return self.request("POST", "/generate", body)

    def open_session(
        self, weight_version: int | None = None, allow_off_policy: bool = False, session_id: str | None = None
    ) -> str:
        """Open a multi-turn session (its turns keep their engine); returns its id. The id is the
        client's (a new one when not given), so an open repeated across a manager restart finds it."""
        body: dict[str, Any] = {
            "allow_off_policy": allow_off_policy,
            "session_id": session_id or uuid.uuid4().hex,
        }
        if weight_version is not None:
            body["weight_version"] = weight_version
        return self.request("POST", "/v1/sessions", body, idempotent=True)["session_id"]

    def send_turn(
        self, session_id: str, input_ids: list[int], rid: str | None = None, **sampling_params: Any
    ) -> dict:
        """The next turn: `input_ids` are the prompt on the first turn, the environment's tokens after
        (masked out of the loss); answers the turn's `output_ids` and `meta_info`.

        The turn carries a `rid` (a new one when not given): sent again across a manager restart,
        it answers the turn that was running or finished there, never a second turn."""
        body = {
            "input_ids": input_ids,
            "sampling_params": sampling_params,
            "return_logprob": True,
            "rid": rid or uuid.uuid4().hex,
        }
        return self.request("POST", f"/v1/sessions/{session_id}/turns", body, idempotent=True)

    def session(self, session_id: str) -> dict:
        """The whole context so far: `context_ids`, `logprobs`, `loss_mask`, `segments`, `turns`."""
        return self.request("GET", f"/v1/sessions/{session_id}")

    def close_session(self, session_id: str) -> dict:
        """Close the session; answers its whole context, as `session` does. Repeated across a manager
        restart that had closed it already, it answers the closed session."""
        tries = 0

        def close() -> bytes:
            nonlocal tries
            tries += 1
            return self._send_once("DELETE", f"/v1/sessions/{session_id}")

        try:
            return json.loads(self._retrying(close, idempotent=True))
        except ManagerError as exc:
            if exc.status != 409 or tries == 1:
                raise
            return self.session(session_id)  # this close's own first try closed it

    def add_worker(
        self,
        url: str,
        kind: str = "local",
        engine_type: str = "sglang",
        capacity: int = 64,
        api_key: str | None = None,
        relay: str | None = None,
    ) -> dict:
        """Register an engine; `api_key` is the engine's own key, sent by the manager on every call;
        `relay`: HOST:PORT of the `rollflow manager relay` on its node, which reads its streams."""
        body = {"url": url, "kind": kind, "engine_type": engine_type, "capacity": capacity}
        return self.request("POST", "/workers", body | _given(api_key=api_key, relay=relay))

    def remove_worker(self, engine_id: int) -> dict:
        return self.request("DELETE", f"/workers/{engine_id}")

    def workers(self) -> list[dict]:
        """Every engine the manager knows: live ones and failed ones waiting for their breaker."""
        return self.request("GET", "/workers?include_failed=true")["workers"]

    def live_workers(self) -> list[dict]:
        """Engines in the pool: healthy, or loading new weights (the manager's `Registry.live`)."""
        return [w for w in self.workers() if w["state"] in ("healthy", "updating")]

    def update_weights(
        self,
        engine_id: int,
        model_path: str | None = None,
        weight_version: int | None = None,
        *,
        weights_url: str | None = None,
        codec: str | None = None,
        transport: str | None = None,
    ) -> dict:
        """Have one engine load a checkpoint folder, or pull `weight_version` from the weight server
        at `weights_url`; it rejoins the pool only on `weight_version`."""
        body = {"weight_version": weight_version} | _given(
            model_path=model_path, weights_url=weights_url, codec=codec, transport=transport
        )
        # repeated across a manager restart, the engine loads the same version again: no harm done
        return self.request("POST", f"/workers/{engine_id}/update_weights", body, idempotent=True)

    def release_worker(self, engine_id: int) -> dict:
        """Drain one engine (its samples resume elsewhere) and have it free its memory; the answer's
        `move` says how many samples moved and how long it took."""
        return self.request("POST", f"/workers/{engine_id}/release", {})

    def resume_worker(
        self,
        engine_id: int,
        *,
        model_path: str | None = None,
        weights_url: str | None = None,
        weight_version: int | None = None,
        transport: str | None = None,
    ) -> dict:
        """Wake a released engine; with a source it loads that (or the newest) version, then rejoins."""
        body = _given(
            model_path=model_path, weights_url=weights_url, weight_version=weight_version, transport=transport
        )
        return self.request("POST", f"/workers/{engine_id}/resume", body)

    def weight_versions(self) -> dict[int, int | None]:
        return {int(k): v for k, v in self.request("GET", "/weight_versions").items()}

    def report_step(
        self, step_time_s: float, bubble_s: float, rollout_s: float | None = None
    ) -> float | None:
        """Tell the manager how the last step went; returns the next local time budget.

        `rollout_s` (the step's rollout time) is what a launcher's autoscaler reads back."""
        body = {"step_time_s": step_time_s, "bubble_s": bubble_s, "rollout_s": rollout_s}
        # repeated across a manager restart, a report may count twice: a nudge to the budget, no more
        return self.request("POST", "/step_report", body, idempotent=True)["budget_s"]

    def last_step_report(self) -> tuple[int, dict | None]:
        """(steps reported so far, the last report or None)."""
        answer = self.request("GET", "/step_report")
        return answer["steps"], answer["last"]


class BatchHandle:
    def __init__(self, client: ManagerClient, batch_id: str, num_groups: int, num_samples: int) -> None:
        self.client = client
        self.batch_id = batch_id
        self.num_groups = num_groups
        self.num_samples = num_samples
        self.received: list[list[int]] = []  # group indexes of each micro-batch received

    def micro_batches(
        self, min_groups: int = 1, max_groups: int | None = None, timeout_s: float | None = None
    ) -> Iterator[list[list[dict]]]:
        """Yield lists of finished groups until every group has been delivered.

        Each call blocks until `min_groups` groups are done (fewer at the end of the batch).
        With `timeout_s`, an empty list is yielded when nothing arrived in time, so the caller
        can decide to `flush()` or keep waiting.
        """
        body: dict[str, Any] = {"min_groups": min_groups, "timeout_s": timeout_s}
        if max_groups is not None:
            body["max_groups"] = max_groups
        while True:
            # the index asked for, and what the client holds: a restarted manager that lost the
            # record of a hand-out (it answers before journaling it) takes it from here
            body["micro_batch"] = len(self.received)
            body["received"] = self.received
            answer = self.client.request("POST", f"/batches/{self.batch_id}/next", body, idempotent=True)
            if answer["groups"]:
                self.received.append([group[0]["group_index"] for group in answer["groups"]])
            if answer["groups"] or not answer["exhausted"]:
                yield answer["groups"]
            if answer["exhausted"]:
                return

    def samples(self, order: str = "completion") -> Iterator[dict]:
        """Every sample of the batch as it finishes (`order="submission"`: in submission order); a
        stream broken by a manager restart is opened again after the last line received."""
        received = 0
        while True:
            query = urllib.parse.urlencode({"order": order, "after": received})
            lines = self.client._retrying(
                lambda query=query: self.client._open("GET", f"/batches/{self.batch_id}/samples?{query}"),
                idempotent=True,
            )
            try:
                with lines:
                    for line in lines:
                        if line.strip():
                            sample = json.loads(line)
                            if "error" in sample and "sample_id" not in sample:
                                raise ManagerError(410, sample["error"]["message"])
                            received += 1
                            yield sample
            except TimeoutError:
                raise self.client._silent() from None
            except (http.client.HTTPException, ConnectionError) as exc:
                log.warning("the sample stream of batch %s broke (%s); opening it again", self.batch_id, exc)
            if received == self.num_samples:
                return

    def abort_groups(self, group_indexes: list[int], n: int) -> int:
        """Abort the samples of these groups that still run (`POST /abort_request` with each sample's
        id, `{batch_id}-{group}-{index}`): each ends with the tokens it has, finish_reason abort.
        Returns how many were running; a finished sample is left as it is."""
        aborted = 0
        for group in group_indexes:
            for index in range(n):
                body = {"rid": f"{self.batch_id}-{group}-{index}"}
                aborted += self.client.request("POST", "/abort_request", body, idempotent=True)["num_aborted"]
        return aborted

    def flush(self) -> list[list[dict]]:
        return self.client.request("POST", f"/batches/{self.batch_id}/flush")["groups"]

    def status(self) -> dict:
        return self.client.request("GET", f"/batches/{self.batch_id}")

    def cancel(self) -> None:
        self.client.request("DELETE", f"/batches/{self.batch_id}")
