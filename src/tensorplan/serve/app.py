"""The routes: OpenAI's /v1/audio endpoints, /v1/models, health and readiness, the web page.

The model loads on a background thread after the server starts listening, so /health
answers at once and /ready says 503 until the sessions exist. Every request's blocking
work (decoding audio, transcribing) runs on the scheduler's worker threads.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import math
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from importlib import resources
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route, WebSocketRoute

from tensorplan.errors import AudioError, AudioTooLongError, UserError
from tensorplan.serve import limits, streaming
from tensorplan.serve.client_secrets import (
    SecretStore,
    create_client_secret,
    create_transcription_session,
)
from tensorplan.serve.config import ServeConfig
from tensorplan.serve.errors import ApiError, bad_request
from tensorplan.serve.idle_trim import IdleTrimmer
from tensorplan.serve.params import RequestParser, TranscriptionRequest
from tensorplan.serve.pool import Cancelled, FixedSessionPool, Job, Scheduler
from tensorplan.serve.realtime import realtime
from tensorplan.serve.responses import render_response
from tensorplan.serve.uploads import Form, read_form
from tensorplan.whisper.limits import check_token_ids
from tensorplan.whisper.options import group_sizes
from tensorplan.whisper.result import Segment, TranscriptionResult

log = logging.getLogger("tensorplan.serve")


class ServerState:
    """The model's lifecycle: loading, ready (with its scheduler) or failed."""

    def __init__(self, config: ServeConfig, load: Callable[[], Any]) -> None:
        self.config = config
        self.load = load
        self.scheduler: Scheduler | None = None
        self.trimmer: IdleTrimmer | None = None  # hands memory back when requests and
        # live updates have stopped for a while
        self.live: Any = None  # the live engine of /v1/realtime, over the same sessions
        self.model: Any = None
        self.error: str | None = None
        self.parser = RequestParser(config.defaults, config.model_names)
        self.secrets = SecretStore()  # browsers' short-lived keys for /v1/realtime
        self.on_failure: Callable[[str], None] = lambda message: None

    def start_loading(self) -> None:
        threading.Thread(target=self._load, name="tensorplan-load", daemon=True).start()

    def _load(self) -> None:
        try:
            model = self.load()
            pool = FixedSessionPool(model, self.config.sessions)
            beams = self.config.defaults.beam_size or 1  # the defaults' group size, made now
            windows = self._engine_windows(model)
            engine = (model.engine(windows, prepare=(beams,))
                      if windows and hasattr(model, "engine") else None)
            self.trimmer = IdleTrimmer()
            scheduler = Scheduler(pool, self.config.max_queue, self.trimmer, engine)
            self.model = model
            self.live = _live_engine(pool, engine is not None, self.trimmer)
            self.parser.multilingual = bool(getattr(model, "is_multilingual", True))
            # last: /ready answers 200 once the scheduler is set, and a realtime connection
            # made the moment after must find the live engine and the model there too
            self.scheduler = scheduler
            use = "for live updates, sharing" if engine is not None else "x"
            log.warning("tensorplan serve: %s ready, %d session(s) %s %d thread(s), "
                        "%.0f MiB each", self.config.model, self.config.sessions, use,
                        self.config.threads, pool.session_bytes / 2**20)
            if engine is not None:
                log.warning("tensorplan serve: step engine, %d requests decode together, "
                            "%.0f MiB held", engine.windows, engine.nbytes / 2**20)
        except Exception as e:  # noqa: BLE001 - reported by /ready, and the server stops
            self.error = f"{type(e).__name__}: {e}" if not isinstance(e, UserError) else str(e)
            log.error("tensorplan serve: cannot load the model: %s", self.error)
            self.on_failure(self.error)

    def _engine_windows(self, model: Any) -> int:
        """--engine-windows, or the most windows whose engine the planner lays out within
        --engine-memory-mb (UserError if not even one fits)."""
        mb = self.config.engine_memory_mb
        if mb is None or not hasattr(model, "engine_windows_within"):
            return self.config.engine_windows
        groups = self.config.engine_groups
        windows = model.engine_windows_within(int(mb * 2**20), groups,
                                              limits.MAX_ENGINE_WINDOWS)
        if windows == 0:
            need = math.ceil(model.engine_bytes(1, groups) / 2**20)
            raise UserError(f"--engine-memory-mb {mb:g}: not even one window of the step "
                            f"engine fits; {self.config.model} needs {need} MB for one (or "
                            "--engine-windows 0 instead: no engine)")
        return int(windows)

    def ready(self) -> Scheduler:
        if self.scheduler is None:
            message = f"the model failed to load: {self.error}" if self.error \
                else "the model is still loading"
            raise ApiError(503, message, code="not_ready", headers={"Retry-After": "2"})
        return self.scheduler

    def close(self) -> None:
        if self.live is not None:
            self.live.shutdown()
        if self.scheduler is not None:
            self.scheduler.close()
            if self.scheduler.engine is not None:
                self.scheduler.engine.close()
            self.scheduler.pool.close()
        if self.trimmer is not None:
            self.trimmer.close()


def _live_engine(pool: FixedSessionPool, share_cores: bool, trimmer: IdleTrimmer) -> Any:
    """Updates borrow the pool's sessions. With the step engine the process's pools have
    every core (serve/threads.py), and updates share them with the engine's work; without
    it each session's count is already its part. The trimmer counts them as work: a
    server that only served realtime connections kept what a flood of them had held (20
    flooding clients: 2,194 MiB after they left, 1,330 after one trim)."""
    from tensorplan.live import LiveEngine

    @contextmanager
    def lend() -> Iterator[Any]:
        with trimmer.active(), pool.session() as session:
            yield session

    return LiveEngine(lend, workers=pool.size, share_cores=share_cores)


def create_app(config: ServeConfig, load: Callable[[], Any]) -> Starlette:
    state = ServerState(config, load)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        state.start_loading()
        yield
        await asyncio.to_thread(state.close)  # cancels what is still queued or running

    routes = [
        Route("/", _index, methods=["GET"]),
        Route("/health", _health, methods=["GET"]),
        Route("/ready", _ready, methods=["GET"]),
        Route("/health/ready", _ready, methods=["GET"]),
        Route("/v1/models", _models, methods=["GET"]),
        Route("/v1/models/{model_id:path}", _model, methods=["GET"]),
        Route("/v1/audio/transcriptions", _transcriptions, methods=["POST"]),
        Route("/v1/audio/translations", _translations, methods=["POST"]),
        Route("/v1/realtime/client_secrets", _client_secrets, methods=["POST"]),
        Route("/v1/realtime/transcription_sessions", _transcription_sessions,
              methods=["POST"]),
        WebSocketRoute("/v1/realtime", realtime),
    ]
    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={ApiError: _api_error, 404: _not_found,
                                        405: _not_allowed})
    app.state.server = state
    return app


def _state(request: Request) -> ServerState:
    return request.app.state.server  # type: ignore[no-any-return]


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return exc.response()


async def _not_found(request: Request, exc: Exception) -> Response:
    return ApiError(404, f"no route {request.url.path}", code="not_found").response()


async def _not_allowed(request: Request, exc: Exception) -> Response:
    return ApiError(405, f"{request.method} is not allowed on {request.url.path}").response()


def _authorize(request: Request) -> None:
    """401 unless the bearer token equals the key (compared in constant time)."""
    key = _state(request).config.api_key
    if key is None:
        return  # no key configured: open (bind to localhost)
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(),
                                                             key.encode()):
        raise ApiError(401, "missing or incorrect API key: send 'Authorization: Bearer KEY'",
                       code="invalid_api_key")


# --- pages and status


async def _index(request: Request) -> Response:
    page = resources.files("tensorplan.serve").joinpath("static/index.html").read_text("utf-8")
    return HTMLResponse(page)


async def _health(request: Request) -> Response:
    """Liveness, and the counters a load test watches: busy sessions, queue depth."""
    state = _state(request)
    body: dict[str, Any] = {"status": "ok", "ready": state.scheduler is not None,
                            "model": state.config.model, **_process_stats()}
    if state.scheduler is not None:
        body.update(state.scheduler.stats())
    if state.live is not None:
        body.update(state.live.stats())
    return JSONResponse(body)


async def _ready(request: Request) -> Response:
    _state(request).ready()
    return JSONResponse({"status": "ready"})


def _process_stats() -> dict[str, int]:
    """Resident memory and OS threads of this process (Linux's /proc; empty elsewhere)."""
    stats: dict[str, int] = {}
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key == "VmRSS":
                stats["rss_bytes"] = int(value.split()[0]) * 1024
            elif key == "Threads":
                stats["threads"] = int(value)
    except OSError:
        pass
    return stats


async def _models(request: Request) -> Response:
    _authorize(request)
    names = _state(request).config.model_names
    return JSONResponse({"object": "list", "data": [_model_card(n) for n in names]})


async def _model(request: Request) -> Response:
    _authorize(request)
    model_id = request.path_params["model_id"]
    if model_id not in _state(request).config.model_names:
        raise ApiError(404, f"the model {model_id!r} does not exist", param="model",
                       code="model_not_found")
    return JSONResponse(_model_card(model_id))


def _model_card(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "tensorplan"}


# --- realtime: keys for browsers


async def _client_secrets(request: Request) -> Response:
    _authorize(request)
    state = _state(request)
    state.ready()  # the session's checks need the model (its languages)
    return await create_client_secret(request, state)


async def _transcription_sessions(request: Request) -> Response:
    _authorize(request)
    state = _state(request)
    state.ready()
    return await create_transcription_session(request, state)


# --- transcription


async def _transcriptions(request: Request) -> Response:
    return await _audio(request, "transcribe")


async def _translations(request: Request) -> Response:
    return await _audio(request, "translate")


async def _audio(request: Request, task: str) -> Response:
    _authorize(request)  # before a byte of the body is read
    state = _state(request)
    scheduler = state.ready()
    try:
        config = state.config
        form = await read_form(request, config.max_upload_bytes, config.spool_dir,
                               config.body_idle_timeout_s, config.body_timeout_s)
    except ClientDisconnect:
        return Response(status_code=400)  # nobody is listening
    try:
        req = _request_from(form, state, task)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Segment | None] = asyncio.Queue()

        opened = asyncio.Event()  # the job has decoded its audio

        def on_segment(segment: Segment) -> None:
            if req.stream:  # each segment to the event loop, in order, as it is decoded
                loop.call_soon_threadsafe(queue.put_nowait, segment)

        def on_open() -> None:
            if req.stream:
                loop.call_soon_threadsafe(opened.set)

        job = Job(_transcriber(form, req, state, on_segment, on_open), cleanup=form.close)
        future = scheduler.submit(job)  # 429 now, before any response has started
    except BaseException:
        form.close()
        raise
    if req.stream:
        future.add_done_callback(lambda f: queue.put_nowait(None))
        await _opened(request, job, future, opened)
        return StreamingResponse(_events(job, future, queue, req),
                                 media_type=streaming.MEDIA_TYPE,
                                 headers={"Cache-Control": "no-cache"})
    result, duration = await _wait(request, job, future)
    return render_response(result, req.response_format, task=task, duration=duration,
                           granularities=req.granularities)


def _request_from(form: Form, state: ServerState, task: str) -> TranscriptionRequest:
    if form.file is None:
        raise bad_request("the 'file' field is missing: upload the audio as 'file'",
                          param="file")
    if form.file.size == 0:
        raise bad_request("the uploaded file is empty", param="file", code="invalid_audio")
    req = state.parser.parse(form, task)
    try:  # now, not as the decode's first step (a stream would have said 200 by then)
        check_token_ids([t for t in req.options.suppress_tokens or () if t >= 0],
                        state.model.dims.n_vocab, "suppress_tokens")
    except UserError as e:
        raise bad_request(str(e), param="suppress_tokens") from None
    _check_engine_groups(req, state)
    if task == "translate" and not state.model.is_multilingual:
        raise bad_request(f"{state.config.model} is English-only and cannot translate; "
                          "serve a multilingual model (e.g. --model base)", param="model")
    return req


def _check_engine_groups(req: TranscriptionRequest, state: ServerState) -> None:
    """Under --engine-memory-mb, a 400 for a request that would make the engine plan a
    batch outside its budget: a group size (beam_size, best_of) the defaults do not use."""
    config = state.config
    if config.engine_memory_mb is None or state.scheduler is None or \
            state.scheduler.engine is None:
        return
    planned = config.engine_groups
    extra = sorted(set(group_sizes(req.options)) - set(planned))
    if extra:
        param = "best_of" if req.options.best_of in extra else "beam_size"
        raise bad_request(f"{param}: this server's step engine is planned within "
                          f"--engine-memory-mb for {' and '.join(map(str, planned))} "
                          f"sequences per window, and this request needs {extra[0]}; "
                          "leave beam_size and best_of at the server's defaults",
                          param=param)


def _transcriber(form: Form, req: TranscriptionRequest, state: ServerState,
                 on_segment: Callable[[Segment], None],
                 on_open: Callable[[], None]) -> Callable[[Any, Job], Any]:
    """The job's body, run on a session's worker thread: (result, audio seconds).
    `on_open` is called once the audio is decoded (at the first progress report)."""
    assert form.file is not None
    path, filename = str(form.file.path), form.file.filename
    max_seconds = state.config.max_audio_seconds

    def run(session: Any, job: Job) -> tuple[TranscriptionResult, float]:
        frames = [0]

        def progress(done: int, total: int) -> None:
            job.check()
            if not frames[0]:
                on_open()
            frames[0] = total

        def segment(seg: Segment) -> None:
            job.check()
            on_segment(seg)

        try:
            result = session.transcribe(path, req.options, on_segment=segment,
                                        progress=progress, max_audio_seconds=max_seconds)
        except AudioTooLongError as e:
            raise ApiError(413, str(e).replace(path, filename) + " this server decodes per "
                           "request", param="file", code="audio_too_long") from None
        except AudioError as e:  # named by the client's file name, not the temp file's
            message = str(e).replace(path, filename)
            if "(--audio-stream)" in message:  # the field the client set, not the CLI flag
                raise bad_request(message.replace(" (--audio-stream)", ""),
                                  param="audio_stream") from None
            raise bad_request(message, param="file", code="invalid_audio") from None
        except (UserError, ValueError) as e:  # e.g. a language the model does not know
            raise bad_request(str(e).replace(path, filename)) from None
        ends = [s.end for s in result.segments]
        # mel frames are 10 ms; with vad_filter they count the speech only
        duration = frames[0] / 100 if frames[0] else max(ends, default=0.0)
        return result, duration

    return run


async def _wait(request: Request, job: Job,
                future: asyncio.Future[Any]) -> tuple[TranscriptionResult, float]:
    """The job's result; a client that hangs up cancels it, which frees its session."""
    await _hold(request, job, future)
    result, duration = _outcome(future)  # _outcome is Any: the unpacking types it
    return result, duration


async def _opened(request: Request, job: Job, future: asyncio.Future[Any],
                  opened: asyncio.Event) -> None:
    """Before a stream's 200: wait until its job has decoded the audio or ended, so an
    upload that is not audio, or is too long, gets its status and JSON error like a
    request without stream (once the 200 is sent, errors are events in the stream)."""
    await _hold(request, job, future, opened)
    if future.done() and not opened.is_set():
        _outcome(future)  # its ApiError, or a result the stream then sends


async def _hold(request: Request, job: Job, future: asyncio.Future[Any],
                until: asyncio.Event | None = None) -> None:
    """Until the job ends (or `until` is set), checking twice a second that the client is
    still there: one that hung up (or a cancelled handler) abandons the job (499)."""
    waiter = asyncio.ensure_future(until.wait()) if until is not None else None
    waits = {future} if waiter is None else {future, waiter}

    def ended() -> bool:
        return future.done() or (until is not None and until.is_set())

    try:
        while not ended():
            await asyncio.wait(waits, timeout=0.5, return_when=asyncio.FIRST_COMPLETED)
            if not ended() and await request.is_disconnected():
                _abandon(job, future)
                raise ApiError(499, "the client closed the connection")
    except asyncio.CancelledError:
        _abandon(job, future)
        raise
    finally:
        if waiter is not None:
            waiter.cancel()


def _abandon(job: Job, future: asyncio.Future[Any]) -> None:
    """Nobody waits for `job` any more: it stops at its next segment (or never starts),
    and its outcome, Cancelled or a result, is dropped quietly (else asyncio logs "Future
    exception was never retrieved" with a traceback for every client that left)."""
    job.cancelled.set()
    future.cancel()  # only takes while it is still queued
    future.add_done_callback(_drop_outcome)


def _drop_outcome(future: asyncio.Future[Any]) -> None:
    if future.cancelled():
        return
    e = future.exception()
    if e is not None and not isinstance(e, (Cancelled, ApiError)):
        log.warning("a transcription whose client had left failed: %s: %s",
                    type(e).__name__, e)


def _outcome(future: asyncio.Future[Any]) -> Any:
    try:
        return future.result()
    except (ApiError, asyncio.CancelledError):
        raise
    except Cancelled:
        raise ApiError(503, "the request was cancelled: the server is stopping") from None
    except Exception as e:
        log.exception("transcription failed")
        raise ApiError(500, f"transcription failed: {type(e).__name__}: {e}") from None


async def _events(job: Job, future: asyncio.Future[Any], queue: asyncio.Queue[Segment | None],
                  req: TranscriptionRequest) -> AsyncIterator[bytes]:
    first = True
    try:
        while (segment := await queue.get()) is not None:
            yield streaming.delta_event(segment, first)
            first = False
        result, _ = _outcome(future)
        yield streaming.done_event(result, req.stream_outputs)
    except ApiError as e:  # the status line is sent: report the error as OpenAI's stream does
        yield streaming.event(e.body())
    finally:
        if not future.done():  # a client gone mid-stream
            _abandon(job, future)
