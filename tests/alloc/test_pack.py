"""`pack` on plain lifetimes, the CSV trace format, and `tensorplan pack`."""

from __future__ import annotations

import csv
import random
from pathlib import Path

import pytest

from tensorplan.alloc import pack
from tensorplan.alloc.pack import Interval
from tensorplan.alloc.trace import read_trace, write_offsets
from tensorplan.cli import main
from tensorplan.errors import TraceError


def no_overlap(intervals: list[Interval], offsets: dict[object, int], alignment: int = 1) -> bool:
    rounded = [(k, s, e, -(-n // alignment) * alignment) for k, s, e, n in intervals]
    for i, (ka, sa, ea, na) in enumerate(rounded):
        for kb, sb, eb, nb in rounded[i + 1 :]:
            if sa < eb and sb < ea and na and nb:  # half-open in time
                oa, ob = offsets[ka], offsets[kb]
                if oa < ob + nb and ob < oa + na:
                    return False
    return True


def cut_rectangle(seed: int, depth: int, width: int = 1000, span: int = 100) -> list[Interval]:
    """Guillotine cuts of a width x span rectangle (bytes x time): the pieces tile it, so
    every time step is exactly full and the optimum arena is `width`."""
    rng = random.Random(seed)
    out: list[Interval] = []

    def cut(t0: int, t1: int, b0: int, b1: int, d: int) -> None:
        if d == 0 or (t1 - t0 < 2 and b1 - b0 < 2):
            out.append((f"r{len(out)}", t0, t1, b1 - b0))
        elif (rng.random() < 0.5 and t1 - t0 >= 2) or b1 - b0 < 2:
            m = rng.randint(t0 + 1, t1 - 1)
            cut(t0, m, b0, b1, d - 1)
            cut(m, t1, b0, b1, d - 1)
        else:
            m = rng.randint(b0 + 1, b1 - 1)
            cut(t0, t1, b0, m, d - 1)
            cut(t0, t1, m, b1, d - 1)

    cut(0, span, 0, width, depth)
    return out


# ---- pack() --------------------------------------------------------------------------------------
@pytest.mark.parametrize("strategy", ["offline", "ggml"])
def test_pack_random_is_valid(strategy: str) -> None:
    rng = random.Random(7)
    intervals: list[Interval] = []
    for i in range(120):
        s = rng.randrange(50)
        intervals.append((i, s, s + 1 + rng.randrange(10), rng.randrange(0, 300)))
    p = pack(intervals, alignment=16, strategy=strategy)
    assert list(p.offsets) == list(range(120))
    assert no_overlap(intervals, p.offsets, 16)
    assert all(o % 16 == 0 for o in p.offsets.values())
    assert p.size >= p.lower_bound > 0
    assert p.size == max(p.offsets[k] + -(-n // 16) * 16 for k, _, _, n in intervals)


@pytest.mark.parametrize("seed", range(6))
def test_pack_cut_rectangle_reaches_known_optimum(seed: int) -> None:
    intervals = cut_rectangle(seed, depth=8)
    p = pack(intervals, budget_s=0.05)
    assert p.lower_bound == 1000 and p.size == 1000
    assert no_overlap(intervals, p.offsets)
    assert pack(intervals, strategy="ggml").size >= 1000


def test_pack_touching_intervals_share() -> None:
    p = pack([("a", 0, 5, 100), ("b", 5, 9, 100), ("c", 4, 6, 10)])
    assert p.offsets["a"] == p.offsets["b"] and p.size == 110 == p.lower_bound


@pytest.mark.parametrize("bad", [("a", 3, 3, 1), ("a", 0, 1, -1)])
def test_pack_rejects_bad_intervals(bad: Interval) -> None:
    with pytest.raises(ValueError):
        pack([bad])
    with pytest.raises(ValueError, match="twice"):
        pack([("x", 0, 1, 1), ("x", 1, 2, 1)])


def test_pack_empty() -> None:
    p = pack([])
    assert p.size == p.lower_bound == 0 and p.ratio == 1.0


# ---- CSV ----------------------------------------------------------------------------------------
def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_read_trace(tmp_path: Path) -> None:
    f = write(tmp_path / "t.csv", "id,lower,upper,size\na,0,3,10\n\nb, 1 ,2,0\n")
    assert list(read_trace(f)) == [("a", 0, 3, 10), ("b", 1, 2, 0)]
    g = write(tmp_path / "u.csv", "size,upper,id,lower,extra\n5,2,x,1,?\n")
    assert list(read_trace(g)) == [("x", 1, 2, 5)]
    # MiniMalloc's columns: gaps, hint and offset are ignored; an alignment dividing the
    # one the offsets get (or none given) is kept by it
    h = write(tmp_path / "m.csv", "id,lower,upper,size,alignment,hint,gaps,offset\n"
              "0,0,4,8,8,-1,1-2,0\n1,1,3,8,,,,8\n")
    assert list(read_trace(h, alignment=16)) == [("0", 0, 4, 8), ("1", 1, 3, 8)]
    # a spreadsheet's blank trailing header cells; an alignment with leading zeros
    k = write(tmp_path / "k.csv", "id,lower,upper,size,alignment,,\n"
              "a,0,2,4,00000000000000000002,,\n")
    assert list(read_trace(k, alignment=4)) == [("a", 0, 2, 4)]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty trace"),
        ("id,lower,upper,size\n", "no intervals"),
        ("id,lower,size\na,0,1\n", "row 1: header lacks column.*upper"),
        ("id,lower,upper,size\na,0,1,4\nb,0,1\n", r"row 3: missing column\(s\) size "),
        ("hint,id,lower,upper,size\nx,a,0,1\n", r"row 2: missing column\(s\) size \(the row "
         r"has 4 fields\)"),
        ("id,lower,upper,size\na,0,1,-4\n", "row 2: negative size"),
        ("id,lower,upper,size\na,0,1,4\nb,5,5,4\n", r"row 3: upper \(5\) <= lower \(5\)"),
        ("id,lower,upper,size\na,0,1.5,4\n", "row 2: .*integers"),
        ("id,lower,upper,size\na,0,x,4\n", "row 2: .*integers"),
        ("id,lower,upper,size\na,0,1,4\nb,0,1,4\na,2,3,4\n", "row 4: id 'a' already used in row 2"),
        # a stray comma: the row's fields no longer line up with the header's names
        ("id,lower,upper,size\na,0,1,4\nb,c,0,1,4\n", "row 3: 5 fields, the header names 4"),
        ("id,lower,upper,size,size\na,0,1,4,5\n", "row 1: column.*named twice: size"),
        # MiniMalloc's per-buffer alignment: kept only where it divides --alignment (1 here)
        ("id,lower,upper,size,alignment\na,0,1,4,1\nb,0,1,4,8\n",
         "row 3: alignment 8 does not divide --alignment 1"),
        ("id,lower,upper,size,alignment\na,0,1,4,0\n", "row 2: alignment must be a positive"),
        ("id,lower,upper,size,alignment\na,0,1,4,x\n", "row 2: alignment must be a positive"),
        ("id,lower,upper,size,alignment\na,0,1,4," + "9" * 5000 + "\n",
         r"row 2: alignment 9+\.\.\. does not divide"),
    ],
)
def test_trace_errors_name_the_row(tmp_path: Path, text: str, message: str) -> None:
    f = write(tmp_path / "bad.csv", text)
    with pytest.raises(TraceError, match=message):
        list(read_trace(f))


def test_write_offsets_atomic(tmp_path: Path) -> None:
    out = tmp_path / "o.csv"
    write_offsets(out, {"a": 0, "b": 64})
    assert out.read_text() == "id,offset\na,0\nb,64\n"

    class Boom(dict[str, int]):
        def items(self):  # type: ignore[no-untyped-def, override]
            yield ("c", 1)
            raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        write_offsets(out, Boom())
    assert out.read_text() == "id,offset\na,0\nb,64\n"  # the old file, intact
    assert [p.name for p in tmp_path.iterdir()] == ["o.csv"]  # no temp left behind


# ---- the CLI ------------------------------------------------------------------------------------
def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["pack", *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("strategy", ["offline", "exact", "ggml"])
def test_cli_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture[str], strategy: str) -> None:
    intervals = cut_rectangle(3, depth=6)
    trace = tmp_path / "trace.csv"
    with trace.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "lower", "upper", "size"])
        w.writerows(intervals)
    out = tmp_path / "offsets.csv"
    args = f"{trace} --out {out} --strategy {strategy} --alignment 8 --budget 0.05"
    code, stdout, _ = run_cli(args.split(), capsys)
    assert code == 0
    with out.open() as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["id", "offset"]
    offsets = {k: int(v) for k, v in rows[1:]}
    assert list(offsets) == [k for k, *_ in intervals]
    assert no_overlap(intervals, offsets, 8)
    last = stdout.strip().splitlines()[-1]
    arena = max(offsets[k] + -(-n // 8) * 8 for k, _, _, n in intervals)
    lb = pack(intervals, alignment=8).lower_bound
    proof = "optimal (proven)" if arena == lb else "best found, not proven"
    assert last == f"arena={arena} lower_bound={lb} ratio={arena / lb:.4f} {proof}"


def test_cli_error_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = write(tmp_path / "t.csv", "id,lower,upper,size\na,0,1,4\nb,2,1,4\n")
    out = tmp_path / "o.csv"
    code, _, err = run_cli([str(trace), "--out", str(out)], capsys)
    assert code == 2 and not out.exists()
    assert err.count("\n") == 1 and "row 3" in err and err.startswith("tensorplan: error:")
    code, _, err = run_cli([str(tmp_path / "missing.csv"), "--out", str(out)], capsys)
    assert code == 2 and "cannot read" in err
    code, _, err = run_cli([str(trace), "--out", str(out), "--alignment", "0"], capsys)
    assert code == 2 and "--alignment" in err


@pytest.mark.slow
def test_cli_million_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rng = random.Random(1)
    trace = tmp_path / "big.csv"
    with trace.open("w") as f:
        f.write("id,lower,upper,size\n")
        for i in range(1_000_000):
            s = rng.randrange(200_000)
            f.write(f"{i},{s},{s + 1 + rng.randrange(20)},{rng.randrange(1, 4096)}\n")
    out = tmp_path / "o.csv"
    code, stdout, _ = run_cli([str(trace), "--out", str(out), "--budget", "0"], capsys)
    assert code == 0 and stdout.splitlines()[-1].startswith("arena=")
    ratio = float(stdout.splitlines()[-1].split("ratio=")[1].split()[0])
    assert 1.0 <= ratio < 1.2
