"""Lifetime traces for `tensorplan pack`: every malformed kind is one error line naming the
file and the row (exit 2) and writes nothing; spreadsheet quirks (a BOM, spaces) work; a
million rows pack in time linear in the rows.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
from clirun import assert_ok, assert_user_error, run_cli

from tensorplan import cli

HEADER = "id,lower,upper,size\n"

# kind -> (file bytes, words the error line must hold)
BROKEN: dict[str, tuple[bytes, str]] = {
    "empty file": (b"", "empty trace (no header)"),
    "header only": (HEADER.encode(), "no intervals after the header"),
    "missing column": (b"id,lower,upper\na,0,2\n", "row 1: header lacks column(s) size"),
    "short row": (HEADER.encode() + b"a,0,2,1\nb,1,3\n", "row 3: missing column(s)"),
    "negative size": (HEADER.encode() + b"a,0,2,-1\n", "row 2: negative size -1"),
    "upper == lower": (HEADER.encode() + b"a,2,2,1\n", "row 2: upper (2) <= lower (2)"),
    "upper < lower": (HEADER.encode() + b"a,5,2,1\n", "row 2: upper (2) <= lower (5)"),
    "non-integer": (HEADER.encode() + b"a,0,2,1.5\n", "row 2: lower, upper and size must be "
                    "integers (lower='0', upper='2', size='1.5')"),
    "digit separators": (HEADER.encode() + b"a,0,2,1_000\n", "size='1_000'"),
    "non-ASCII digits": (HEADER.encode() + "a,0,2,１０\n".encode(), "size='１０'"),
    "duplicate id": (HEADER.encode() + b"a,0,2,1\na,1,3,1\n", "row 3: id 'a' already used in "
                     "row 2"),
    "beyond 64 bits": (HEADER.encode() + b"a,0,2,99999999999999999999\n",
                       "row 2: lower, upper and size must fit in 64 bits"),
    "sizes beyond any memory": (HEADER.encode() + b"a,0,2,2305843009213693952\nb,0,2,1\n",
                                "row 3: sizes add up to more than 2^61 bytes"),
    "5000-digit number": (HEADER.encode() + b"a,0,2," + b"9" * 5000 + b"\n", "64 bits"),
    "5000-character text": (HEADER.encode() + b"a,0,2,x" + b"9" * 5000 + b"\n",
                            "size='x99999999999999999999999'..."),
    "not UTF-8": (HEADER.encode() + b"a,0,2,1\n\xff\xfe,1,2,3\n", "row 3 (byte 28): not UTF-8"),
    "UTF-16": ("id,lower,upper,size\na,0,2,1\n".encode("utf-16"), "not UTF-8"),
    "unclosed quote": (HEADER.encode() + b'"a,0,2,1\n' + b"x" * 200_000,
                       "malformed CSV (field larger than field limit"),
}


def _pack(trace: Path, out: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    rc = cli.main(["pack", str(trace), "--out", str(out)])
    return rc, capsys.readouterr().err


@pytest.mark.parametrize("kind", list(BROKEN))
def test_malformed_trace_is_one_line(tmp_path: Path, kind: str,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    data, words = BROKEN[kind]
    trace = tmp_path / "trace.csv"
    trace.write_bytes(data)
    rc, err = _pack(trace, tmp_path / "offsets.csv", capsys)
    line = assert_user_error(rc, err, f"{trace}: ", words)
    assert len(line) < 300
    assert list(tmp_path.iterdir()) == [trace]  # no output, no temp file


def test_missing_and_directory_traces(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, err = _pack(tmp_path / "nope.csv", tmp_path / "o.csv", capsys)
    assert_user_error(rc, err, "nope.csv: cannot read: No such file or directory")
    rc, err = _pack(tmp_path, tmp_path / "o.csv", capsys)
    assert_user_error(rc, err, f"{tmp_path}: cannot read: is a directory")


@pytest.mark.parametrize("kind", ["byte-order mark", "spaces around fields", "blank lines",
                                  "reordered columns"])
def test_spreadsheet_quirks_work(tmp_path: Path, kind: str,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    text = {
        "byte-order mark": "\ufeffid,lower,upper,size\r\na,0,2,10\r\nb,1,3,5\r\n",
        "spaces around fields": " id , lower , upper , size \n a , 0 , 2 , 10 \nb,1,3,5\n",
        "blank lines": "id,lower,upper,size\n\na,0,2,10\n\nb,1,3,5\n\n",
        "reordered columns": "size,upper,id,lower\n10,2,a,0\n5,3,b,1\n",
    }[kind]
    trace = tmp_path / "trace.csv"
    trace.write_text(text, encoding="utf-8", newline="")
    out = tmp_path / "offsets.csv"
    rc, _ = _pack(trace, out, capsys)
    assert rc == 0
    offsets = {row["id"]: int(row["offset"]) for row in csv.DictReader(out.open())}
    assert offsets.keys() == {"a", "b"} and abs(offsets["a"] - offsets["b"]) >= 5


def test_cli_subset_in_a_subprocess(tmp_path: Path) -> None:
    for kind in ("missing column", "not UTF-8", "duplicate id"):
        trace = tmp_path / f"{kind}.csv"
        trace.write_bytes(BROKEN[kind][0])
        run = run_cli("pack", trace, "--out", tmp_path / "offsets.csv")
        assert_user_error(run.rc, run.stderr, str(trace), BROKEN[kind][1])
    assert not (tmp_path / "offsets.csv").exists()


# --- many rows ---------------------------------------------------------------------------------


def _random_trace(path: Path, n: int, seed: int = 0) -> None:
    """n intervals, ~25 live at any time, sizes up to 1 MiB."""
    rng = np.random.default_rng(seed)
    lower = rng.integers(0, n, n)
    upper = lower + rng.integers(1, 50, n)
    size = rng.integers(1, 1 << 20, n)
    with path.open("w") as f:
        f.write(HEADER)
        for start in range(0, n, 100_000):
            stop = min(start + 100_000, n)
            f.write("".join(f"t{i},{a},{b},{c}\n" for i, a, b, c in zip(
                range(start, stop), lower[start:stop].tolist(), upper[start:stop].tolist(),
                size[start:stop].tolist(), strict=True)))


def _check_packing(trace: Path, out: Path, n: int) -> None:
    """Every id once; no two intervals live at the same time share a byte."""
    rows = list(csv.reader(trace.open()))[1:]
    offsets = dict(csv.reader(out.open()))
    assert offsets.pop("id") == "offset" and len(offsets) == n
    events = []
    for key, lower, upper, nbytes in rows:
        events.append((int(lower), 1, int(offsets[key]), int(nbytes)))
        events.append((int(upper), 0, int(offsets[key]), int(nbytes)))  # ends free first
    live: set[tuple[int, int]] = set()
    for _, starts, offset, size in sorted(events):
        if not starts:
            live.discard((offset, size))
            continue
        for o, s in live:
            assert offset + size <= o or o + s <= offset, "live intervals overlap"
        live.add((offset, size))


def test_hundred_thousand_rows(tmp_path: Path) -> None:
    trace, out = tmp_path / "trace.csv", tmp_path / "offsets.csv"
    _random_trace(trace, 100_000)
    run = run_cli("pack", trace, "--out", out, "--strategy", "ggml")
    assert_ok(run)
    _check_packing(trace, out, 100_000)


@pytest.mark.slow
def test_million_rows_pack_in_linear_time(tmp_path: Path) -> None:
    """Default (offline) strategy: 10x the rows may cost at most ~2x more than 10x the CPU
    time (CPU, not wall time: other jobs on a shared machine stretch wall time unevenly)."""
    cpu = {}
    for n in (100_000, 1_000_000):
        trace, out = tmp_path / f"{n}.csv", tmp_path / f"{n}.offsets.csv"
        _random_trace(trace, n)
        run = run_cli("pack", trace, "--out", out, timeout=1800)
        assert_ok(run)
        cpu[n] = run.cpu_seconds
        print(f"pack {n} rows: {run.cpu_seconds:.1f} s CPU, {run.seconds:.1f} s wall, "
              f"{run.maxrss_kb / 1024:.0f} MB peak RSS")
        with out.open() as f:
            assert sum(1 for _ in f) == n + 1
    assert cpu[1_000_000] / cpu[100_000] < 20, cpu
