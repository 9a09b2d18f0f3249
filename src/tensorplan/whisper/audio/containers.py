"""Which media files ffmpeg may open for tensorplan: self-contained audio and video
containers only, read through Python's own file object (docs/robustness.md).

ffmpeg's demuxers include playlists and scripts that name other resources (hls, dash,
concat/ffconcat, sdp, image sequences, ...). Opened on an uploaded file they read files of the
server's disk or fetch URLs from the server's network, and the transcript gives the contents
back. So every open passes an allow-list of demuxers that only read the bytes they were given
(`format_whitelist`, which ffmpeg checks after probing and before the demuxer reads a
header), and allows no protocol for nested opens but `file` (none of these demuxers opens
one). A path is opened by Python, never handed to ffmpeg as a URL ("concat:a|b",
"http://...").
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

from tensorplan.errors import UserError
from tensorplan.files import open_regular

# Demuxers of plain containers, by ffmpeg's short name. A multi-name demuxer matches by any
# of its names ("mov" is "mov,mp4,m4a,3gp,3g2,mj2"; "matroska" is "matroska,webm"). mov's
# external data references stay off (its enable_drefs option defaults to 0).
DEMUXERS = (
    "aac", "ac3", "aiff", "amr", "amrnb", "amrwb", "ape", "asf", "au", "avi", "caf", "dsf",
    "dts", "dtshd", "eac3", "flac", "flv", "gsm", "loas", "matroska", "mlp", "mov", "mp3",
    "mpc", "mpc8", "mpeg", "mpegts", "mxf", "nistsphere", "nut", "ogg", "oma", "qcp", "shn",
    "sox", "tak", "truehd", "tta", "voc", "w64", "wav", "wv", "xwma",
)
NESTED_PROTOCOLS = "file"  # for a demuxer's own nested opens; none of DEMUXERS makes one
OPEN_OPTIONS = {"format_whitelist": ",".join(DEMUXERS), "protocol_whitelist": NESTED_PROTOCOLS}
REFUSED = ("not a self-contained audio or video file (pictures, playlists such as m3u8, concat "
           "scripts and other formats that refer to other files or URLs are not decoded)")


def open_container(file: IO[bytes], **kwargs: Any) -> Any:
    """av.open(file) restricted to DEMUXERS; av's errors propagate (see `open_error`)."""
    import av

    return av.open(file, mode="r", options=dict(OPEN_OPTIONS), **kwargs)


def refused(e: BaseException) -> bool:
    """Whether av.open's error is the allow-list refusing the probed demuxer (EINVAL)."""
    return getattr(e, "errno", None) == errno.EINVAL


@contextmanager
def probe(path: str | os.PathLike[str]) -> Iterator[Any]:
    """The container of a regular file on disk, opened by Python and restricted to
    DEMUXERS, for reading its header (a duration). Raises av's errors, and OSError for what
    cannot be opened or is not a regular file (a FIFO would block the probe)."""
    try:
        file = open_regular(path, "audio file")
    except UserError as e:
        raise OSError(str(e)) from None
    with file, open_container(file, metadata_errors="ignore") as container:
        yield container
