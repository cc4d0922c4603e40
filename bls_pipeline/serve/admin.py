"""Triton's model-repository and model-config APIs, called with the admin key: what the
launcher (drain, the watchdog's reload) and `bls-rollout` do to a running server; and a
model's readiness, which needs no key (model_ready).

Errors come as AdminError, saying which call failed and with Triton's own message.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

__all__ = ["ADMIN_HEADER", "AdminError", "RepositoryAdmin", "model_ready"]

ADMIN_HEADER = "triton-admin-key"  # over HTTP; gRPC metadata is triton-grpc-protocol-<this>


class AdminError(RuntimeError):
    """A repository or config call failed; the message names the call and why."""


class RepositoryAdmin:
    """The admin APIs of the server whose HTTP endpoint is `url` (host:port, or a URL)."""

    def __init__(self, url: str, admin_key: str, timeout_s: float = 300.0):
        self.base = url if url.startswith("http") else f"http://{url}"
        self.headers = {ADMIN_HEADER: admin_key, "Content-Type": "application/json"}
        self.timeout_s = timeout_s  # a load returns once the model is READY: it can take minutes

    def call(self, method: str, path: str, body: dict | None = None, timeout_s: float | None = None) -> object:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=self.headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout_s or self.timeout_s) as r:
                text = r.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            try:
                detail = json.loads(detail).get("error", detail)
            except ValueError:
                pass
            raise AdminError(f"{method} {path}: HTTP {exc.code}: {detail}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise AdminError(f"no server at {self.base} ({exc})") from None
        return json.loads(text) if text else None

    def index(self, timeout_s: float = 10.0) -> list[dict]:
        """Every model version the repository knows, with its state."""
        return self.call("POST", "/v2/repository/index", {}, timeout_s=timeout_s)  # type: ignore[return-value]

    def states(self, timeout_s: float = 10.0) -> dict[str, str]:
        return {m["name"]: m.get("state", "") for m in self.index(timeout_s)}

    def ready_versions(self, model: str) -> tuple[int, ...]:
        return tuple(sorted(int(m["version"]) for m in self.index() if m.get("name") == model
                            and m.get("state") == "READY" and str(m.get("version", "")).isdigit()))

    def config(self, model: str, timeout_s: float = 10.0) -> dict:
        """The model's config as served (JSON)."""
        return self.call("GET", f"/v2/models/{model}/config", timeout_s=timeout_s)  # type: ignore[return-value]

    def load(self, model: str, config: dict | None = None) -> None:
        """Load (or, with a config that differs from the one served, load anew) `model`;
        returns once Triton has answered, i.e. the model is READY or failed."""
        self.call("POST", f"/v2/repository/models/{model}/load",
                  {"parameters": {"config": json.dumps(config)}} if config is not None else {})

    def unload(self, model: str, timeout_s: float = 30.0) -> None:
        """Begin unloading `model` (Triton answers at once; the copy goes once no request holds it)."""
        self.call("POST", f"/v2/repository/models/{model}/unload", {}, timeout_s=timeout_s)


def model_ready(url: str, model: str, timeout_s: float) -> bool:
    """Whether the server whose HTTP endpoint is `url` (host:port) says `model` is READY
    (GET /v2/models/<model>/ready); False where it does not answer."""
    try:
        with urllib.request.urlopen(f"http://{url}/v2/models/{model}/ready", timeout=timeout_s) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False
