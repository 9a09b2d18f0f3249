"""Short-lived keys for browsers: `POST /v1/realtime/client_secrets` (OpenAI's current API)
and `POST /v1/realtime/transcription_sessions` (the beta one).

A web page must not hold the server's API key. Its backend asks, with the key, for a
client secret (`ek_...`) that carries the session's settings; the page connects to
`/v1/realtime` with it (the `openai-insecure-api-key.ek_...` subprotocol, or a bearer
header). The connection starts with those settings, and a `session.update` may change
them, as on OpenAI's. A secret opens any number of connections until it expires; a
connection it opened outlives it. Secrets live in this process's memory only, so they
end with it.
"""

from __future__ import annotations

import json
import math
import re
import secrets
import time
from collections.abc import Callable
from typing import Any

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from tensorplan.serve.errors import ApiError, bad_request
from tensorplan.serve.realtime_session import RealtimeSession, SessionError
from tensorplan.serve.uploads import timed_body

PREFIX = "ek_"  # how OpenAI's client secrets look; anything else is taken for an API key
DEFAULT_SECONDS = 600  # the current API's default lifetime
BETA_SECONDS = 60  # the beta's ("all tokens expire after one minute")
MIN_SECONDS, MAX_SECONDS = 10, 7200  # OpenAI's bounds for `seconds`
# Outstanding secrets at once; past it a request gets 429 until some expire. One holds a
# session's settings, a prompt of up to 8,192 characters: 4,096 secrets with prompts of
# 8,192 emoji (4 bytes each in a Python str) took the server's RSS up by 128 MB.
MAX_SECRETS = 4096
MAX_BODY_BYTES = 256 << 10  # a session object with the longest prompt is ~33 kB of JSON


class SecretStore:
    """The secrets not yet expired, with the session each carries."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._secrets: dict[str, tuple[float, RealtimeSession]] = {}

    def __len__(self) -> int:
        self._sweep()
        return len(self._secrets)

    def issue(self, session: RealtimeSession, seconds: int) -> tuple[str, int]:
        """(value, expires_at in Unix seconds) of a new secret for `session`."""
        self._sweep()
        if len(self._secrets) >= MAX_SECRETS:
            raise ApiError(429, f"{MAX_SECRETS} client secrets are outstanding: wait for some "
                           "to expire, or ask for shorter lives (expires_after.seconds)",
                           code="rate_limit_exceeded", headers={"Retry-After": "10"})
        value = PREFIX + secrets.token_urlsafe(24)
        expires_at = math.ceil(self._clock()) + seconds  # never less than asked
        self._secrets[value] = (expires_at, session)
        return value, expires_at

    def session(self, value: str) -> RealtimeSession | None:
        """The session of a live secret, or None (unknown or expired)."""
        found = self._secrets.get(value)
        if found is None or found[0] <= self._clock():
            return None
        return found[1]

    def _sweep(self) -> None:
        now = self._clock()
        for value in [v for v, (until, _) in self._secrets.items() if until <= now]:
            del self._secrets[value]


async def create_client_secret(request: Request, state: Any) -> Response:
    """OpenAI's `client.realtime.client_secrets.create(expires_after=..., session=...)`:
    only transcription sessions are served here."""
    body = await _json_body(request, state)
    seconds = _seconds(body.get("expires_after"), "expires_after", DEFAULT_SECONDS)
    # a session.type other than "transcription" is refused by the session's own reading
    settings = body.get("session", {"type": "transcription"})
    session = _session(state, {"type": "session.update", "session": settings}, "current")
    value, expires_at = state.secrets.issue(session, seconds)
    return JSONResponse({"value": value, "expires_at": expires_at,
                         "session": {**session.render(), "expires_at": expires_at}})


async def create_transcription_session(request: Request, state: Any) -> Response:
    """The beta's `client.beta.realtime.transcription_sessions.create(...)`: the session's
    fields at the top level, the secret in `client_secret`."""
    body = await _json_body(request, state)
    lifetime = body.pop("client_secret", None)
    if lifetime is not None and not isinstance(lifetime, dict):
        raise bad_request("client_secret must be an object", param="client_secret")
    seconds = _seconds((lifetime or {}).get("expires_at"), "client_secret.expires_at",
                       BETA_SECONDS)
    session = _session(state, {"type": "transcription_session.update", "session": body},
                       "beta")
    value, expires_at = state.secrets.issue(session, seconds)
    return JSONResponse({**session.render(),
                         "client_secret": {"value": value, "expires_at": expires_at}})


def _session(state: Any, event: dict[str, Any], shape: str) -> RealtimeSession:
    start = RealtimeSession(id="sess_" + secrets.token_hex(8), shape=shape,
                            model=state.config.model)
    try:
        return start.updated(event, state.config.model_names, state.model.is_multilingual)
    except SessionError as e:
        # the beta's fields sit at the top level of its body, not under `session`
        if shape == "beta":
            raise bad_request(re.sub(r"\bsession\.", "", str(e)),
                              param=e.param.removeprefix("session.")) from None
        raise bad_request(str(e), param=e.param) from None


def _seconds(value: Any, param: str, default: int) -> int:
    if value is None:
        return default
    if not isinstance(value, dict):
        raise bad_request(f"{param} must be an object", param=param)
    if value.get("anchor", "created_at") != "created_at":
        raise bad_request(f"{param}.anchor must be 'created_at'", param=f"{param}.anchor")
    seconds = value.get("seconds", default)
    if type(seconds) is not int or not MIN_SECONDS <= seconds <= MAX_SECONDS:
        raise bad_request(f"{param}.seconds must be a whole number from {MIN_SECONDS} to "
                          f"{MAX_SECONDS}, got {str(seconds)[:40]}", param=f"{param}.seconds")
    return seconds


async def _json_body(request: Request, state: Any) -> dict[str, Any]:
    """The request's JSON object, read up to MAX_BODY_BYTES (413 past it) within the
    server's body timeouts (408 past them)."""
    data = bytearray()
    config = state.config
    try:
        async for chunk in timed_body(request.stream(), config.body_idle_timeout_s,
                                      config.body_timeout_s):
            data += chunk
            if len(data) > MAX_BODY_BYTES:
                raise ApiError(413, f"the body is over {MAX_BODY_BYTES} bytes: a session's "
                               "settings fit in far less", code="request_too_large")
    except ClientDisconnect:
        raise bad_request("the client left before its body arrived") from None
    try:
        body = json.loads(data) if data.strip() else {}
    except (ValueError, RecursionError):
        raise bad_request("the body is not JSON", code="invalid_json") from None
    if not isinstance(body, dict):
        raise bad_request("the body must be a JSON object", code="invalid_json")
    return body
