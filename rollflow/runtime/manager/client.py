"""A trainer's view of the manager: submit a batch, iterate over micro-batches of finished groups.

Blocking and dependency-free (urllib), because trainers are synchronous loops:

    client = ManagerClient("http://127.0.0.1:30100")
    batch = client.submit(prompts, n=8, max_new_tokens=256, temperature=1.0)
    for groups in batch.micro_batches(min_groups=4):
        train_on(groups)          # each group: the n samples (dicts) of one prompt
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
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


class ManagerClient:
    def __init__(self, url: str, token: str | None = None, timeout_s: float = 3600.0) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s

    def request(self, method: str, path: str, body: Any = None) -> Any:
        return json.loads(self._send(method, path, body))

    def metrics(self) -> dict[str, float]:
        """The manager's Prometheus counters and gauges, each summed over its labels."""
        from prometheus_client.parser import text_string_to_metric_families

        totals: dict[str, float] = {}
        for family in text_string_to_metric_families(self._send("GET", "/metrics").decode()):
            for sample in family.samples:
                totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
        return totals

    def _send(self, method: str, path: str, body: Any = None) -> bytes:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as response:
                return response.read()
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                message = json.loads(raw)["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = raw.decode(errors="replace")
            raise ManagerError(exc.code, message) from None
        except urllib.error.URLError as exc:
            raise ManagerUnreachable(f"cannot reach the manager at {self.url}: {exc.reason}") from None

    def submit(
        self, prompts: list[list[int]], n: int = 1, allow_off_policy: bool = False, **sampling_params: Any
    ) -> BatchHandle:
        """Submit prompts x n samples; `sampling_params` are SGLang's (max_new_tokens, temperature, ...)."""
        status = self.request(
            "POST",
            "/batches",
            {
                "prompts": prompts,
                "n": n,
                "sampling_params": sampling_params,
                "allow_off_policy": allow_off_policy,
            },
        )
        return BatchHandle(self, status["batch_id"], status["num_groups"])

    def generate(self, input_ids: list[int], return_logprob: bool = True, **sampling_params: Any) -> dict:
        body = {"input_ids": input_ids, "sampling_params": sampling_params, "return_logprob": return_logprob}
        return self.request("POST", "/generate", body)

    def add_worker(
        self,
        url: str,
        kind: str = "local",
        engine_type: str = "sglang",
        capacity: int = 64,
        api_key: str | None = None,
    ) -> dict:
        """Register an engine; `api_key` is the engine's own key, sent by the manager on every call."""
        body = {"url": url, "kind": kind, "engine_type": engine_type, "capacity": capacity}
        return self.request("POST", "/workers", body | ({"api_key": api_key} if api_key else {}))

    def remove_worker(self, engine_id: int) -> dict:
        return self.request("DELETE", f"/workers/{engine_id}")

    def workers(self) -> list[dict]:
        return self.request("GET", "/workers")["workers"]

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
    ) -> dict:
        """Have one engine load a checkpoint folder, or pull `weight_version` from the weight server
        at `weights_url`; it rejoins the pool only on `weight_version`."""
        body: dict[str, Any] = {"weight_version": weight_version}
        if model_path is not None:
            body["model_path"] = model_path
        if weights_url is not None:
            body["weights_url"] = weights_url
        if codec is not None:
            body["codec"] = codec
        return self.request("POST", f"/workers/{engine_id}/update_weights", body)

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
    ) -> dict:
        """Wake a released engine; with a source it loads that (or the newest) version, then rejoins."""
        body = {
            key: value
            for key, value in (
                ("model_path", model_path),
                ("weights_url", weights_url),
                ("weight_version", weight_version),
            )
            if value is not None
        }
        return self.request("POST", f"/workers/{engine_id}/resume", body)

    def weight_versions(self) -> dict[int, int | None]:
        return {int(k): v for k, v in self.request("GET", "/weight_versions").items()}

    def report_step(
        self, step_time_s: float, bubble_s: float, rollout_s: float | None = None
    ) -> float | None:
        """Tell the manager how the last step went; returns the next local time budget.

        `rollout_s` (the step's rollout time) is what a launcher's autoscaler reads back."""
        body = {"step_time_s": step_time_s, "bubble_s": bubble_s, "rollout_s": rollout_s}
        return self.request("POST", "/step_report", body)["budget_s"]

    def last_step_report(self) -> tuple[int, dict | None]:
        """(steps reported so far, the last report or None)."""
        answer = self.request("GET", "/step_report")
        return answer["steps"], answer["last"]


class BatchHandle:
    def __init__(self, client: ManagerClient, batch_id: str, num_groups: int) -> None:
        self.client = client
        self.batch_id = batch_id
        self.num_groups = num_groups

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
            answer = self.client.request("POST", f"/batches/{self.batch_id}/next", body)
            if answer["groups"] or not answer["exhausted"]:
                yield answer["groups"]
            if answer["exhausted"]:
                return

    def flush(self) -> list[list[dict]]:
        return self.client.request("POST", f"/batches/{self.batch_id}/flush")["groups"]

    def status(self) -> dict:
        return self.client.request("GET", f"/batches/{self.batch_id}")

    def cancel(self) -> None:
        self.client.request("DELETE", f"/batches/{self.batch_id}")
