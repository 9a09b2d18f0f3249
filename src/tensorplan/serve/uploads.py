"""A multipart/form-data body, streamed: fields into memory, the file into a bounded temp file.

Starlette's own `request.form()` spools a file of any size to disk before the handler sees
it. Here the declared Content-Length is checked before a byte is read, and the bytes are
counted as they arrive, so an oversized upload is refused (413) with at most the limit
written, and the temp file is deleted whatever happens.
"""

from __future__ import annotations

import asyncio
import os
import re
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.requests import Request

from tensorplan.serve.errors import ApiError, bad_request
from tensorplan.serve.limits import BODY_IDLE_TIMEOUT_S, BODY_TIMEOUT_S

FIELDS_ALLOWANCE = 1 << 20  # bytes of form fields and multipart framing besides the file
MAX_FIELD_BYTES = 64 << 10  # one text field (a prompt is far shorter)
MAX_FIELDS = 100


@dataclass
class Upload:
    path: Path  # the temp file holding the uploaded bytes
    filename: str
    content_type: str
    size: int


@dataclass
class Form:
    fields: dict[str, list[str]] = field(default_factory=dict)
    file: Upload | None = None

    def get(self, name: str) -> str | None:
        values = self.fields.get(name)
        return values[-1] if values else None

    def getall(self, name: str) -> list[str]:
        return self.fields.get(name, [])

    def close(self) -> None:
        if self.file is not None:
            self.file.path.unlink(missing_ok=True)


def too_large(max_bytes: int) -> ApiError:
    return ApiError(413, f"upload too large: the limit is {max_bytes // (1 << 20)} MB",
                    param="file", code="file_too_large")


async def read_form(request: Request, max_bytes: int, spool_dir: str | None = None,
                    idle_timeout_s: float = BODY_IDLE_TIMEOUT_S,
                    timeout_s: float = BODY_TIMEOUT_S) -> Form:
    """Parse the request's multipart body; ApiError 413/415/400 when it cannot be used, 408
    when a piece of it takes longer than `idle_timeout_s` or all of it than `timeout_s`."""
    ctype, params = parse_options_header(request.headers.get("content-type"))
    if ctype != b"multipart/form-data" or b"boundary" not in params:
        raise ApiError(415, "expected a multipart/form-data body with an audio 'file' field",
                       code="unsupported_media_type")
    max_body = max_bytes + FIELDS_ALLOWANCE
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_body:
        raise too_large(max_bytes)  # refused before a byte of the body is read
    reader = _FormReader(params[b"boundary"], max_bytes, spool_dir)
    try:
        received = 0
        async for chunk in timed_body(request.stream(), idle_timeout_s, timeout_s, "file"):
            received += len(chunk)
            if received > max_body:  # a lying or absent Content-Length
                raise too_large(max_bytes)
            reader.write(chunk)
        return reader.finish()
    except BaseException:
        reader.abort()
        raise


async def timed_body(chunks: AsyncIterator[bytes], idle_s: float, total_s: float,
                     param: str | None = None) -> AsyncIterator[bytes]:
    """The body's chunks, each within `idle_s` of the one before and all within `total_s`:
    a client dribbling its upload does not hold a connection (and a spooled file) forever.
    The 408 names `param` (the form's file, or nothing for a JSON body)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + total_s
    while True:
        wait = min(idle_s, deadline - loop.time())
        try:
            chunk = await asyncio.wait_for(anext(chunks), timeout=max(wait, 0.0))
        except StopAsyncIteration:
            return
        except TimeoutError:
            what = f"no data for {idle_s:g} s" if wait == idle_s else \
                f"not complete after {total_s:g} s"
            raise ApiError(408, f"upload too slow: {what}", param=param,
                           code="request_timeout") from None
        yield chunk


class _FormReader:
    """python-multipart's push parser, with callbacks that route each part's bytes."""

    def __init__(self, boundary: bytes, max_bytes: int, spool_dir: str | None) -> None:
        self.form = Form()
        self.max_bytes = max_bytes
        self.spool_dir = spool_dir
        self._headers: dict[str, str] = {}
        self._header_name = b""
        self._header_value = b""
        self._name = ""
        self._text: bytearray | None = None  # the current text field
        self._charset = "UTF-8"  # and the charset its part names
        self._sink: IO[bytes] | None = None  # the current file part
        self._n_fields = 0
        self._parser = MultipartParser(boundary, {
            "on_part_begin": self._part_begin,
            "on_header_field": self._header_field,
            "on_header_value": self._header_value_data,
            "on_header_end": self._header_end,
            "on_headers_finished": self._headers_finished,
            "on_part_data": self._part_data,
            "on_part_end": self._part_end,
        })

    def write(self, chunk: bytes) -> None:
        try:
            self._parser.write(chunk)
        except MultipartParseError as e:
            raise bad_request(f"malformed multipart body: {e}") from None

    def finish(self) -> Form:
        try:
            self._parser.finalize()
        except MultipartParseError as e:
            raise bad_request(f"malformed multipart body: {e}") from None
        if self._sink is not None or self._text is not None:
            raise bad_request("malformed multipart body: it ends inside a part")
        return self.form

    def abort(self) -> None:
        if self._sink is not None:
            self._sink.close()
            self._sink = None
        self.form.close()

    # parser callbacks

    def _part_begin(self) -> None:
        self._headers = {}

    def _header_field(self, data: bytes, start: int, end: int) -> None:
        self._header_name += data[start:end]

    def _header_value_data(self, data: bytes, start: int, end: int) -> None:
        self._header_value += data[start:end]

    def _header_end(self) -> None:
        name = self._header_name.decode("latin-1").strip().lower()
        self._headers[name] = self._header_value.decode("latin-1").strip()
        self._header_name = self._header_value = b""

    def _headers_finished(self) -> None:
        _, disposition = parse_options_header(self._headers.get("content-disposition"))
        self._name = disposition.get(b"name", b"").decode("utf-8", "replace")
        filename = disposition.get(b"filename")
        if filename is None:
            self._n_fields += 1
            if self._n_fields > MAX_FIELDS:
                raise bad_request(f"more than {MAX_FIELDS} form fields")
            self._text = bytearray()
            # a text part may say its charset (RFC 7578 4.4); UTF-8 when it does not
            _, params = parse_options_header(self._headers.get("content-type"))
            self._charset = params.get(b"charset", b"UTF-8").decode("latin-1").strip()
            try:  # (an empty input is decoded without looking the codec up)
                b"a".decode(self._charset)  # also refuses codecs that are no text encoding
            except UnicodeError:
                pass  # a text encoding that needs more than one byte (UTF-16)
            except LookupError:
                raise bad_request(f"form field {self._name!r}: unknown charset "
                                  f"{self._charset[:40]!r}", param=self._name) from None
            return
        if self._name != "file":
            raise bad_request(f"unexpected file field {self._name!r}; send the audio as 'file'",
                              param=self._name)
        if self.form.file is not None:
            raise bad_request("more than one 'file' field", param="file")
        name = filename.decode("utf-8", "replace")
        fd, path = tempfile.mkstemp(prefix="tensorplan-upload-", suffix=_suffix(name),
                                    dir=self.spool_dir)
        self._sink = os.fdopen(fd, "wb")
        self.form.file = Upload(Path(path), name, self._headers.get("content-type", ""), 0)

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        if self._sink is not None:
            upload = self.form.file
            assert upload is not None
            upload.size += end - start
            if upload.size > self.max_bytes:
                raise too_large(self.max_bytes)
            self._sink.write(data[start:end])
        elif self._text is not None:
            if len(self._text) + end - start > MAX_FIELD_BYTES:
                raise bad_request(f"form field {self._name!r} is longer than "
                                  f"{MAX_FIELD_BYTES} bytes", param=self._name)
            self._text += data[start:end]

    def _part_end(self) -> None:
        if self._sink is not None:
            self._sink.close()
            self._sink = None
        elif self._text is not None:
            try:  # a prompt of U+FFFD would decode as if the client had sent that
                value = self._text.decode(self._charset)
            except UnicodeError as e:
                raise bad_request(f"form field {self._name!r} is not {self._charset[:40]} "
                                  f"text (byte {getattr(e, 'start', 0)})",
                                  param=self._name) from None
            self.form.fields.setdefault(self._name, []).append(value)
            self._text = None


def _suffix(filename: str) -> str:
    """The upload's extension, if it is a plain one (a hint for the demuxer, never a path)."""
    ext = os.path.splitext(filename)[1]
    return ext if re.fullmatch(r"\.[A-Za-z0-9]{1,8}", ext) else ""
