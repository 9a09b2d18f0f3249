"""Element types as plain metadata: a name and a width. Backends map names to their own types."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class DType:
    name: str  # numpy-compatible name, e.g. "float32"
    itemsize: int  # bytes per element

    def __repr__(self) -> str:
        return self.name


float32 = DType("float32", 4)
float16 = DType("float16", 2)
float64 = DType("float64", 8)
int64 = DType("int64", 8)
int32 = DType("int32", 4)
int16 = DType("int16", 2)
int8 = DType("int8", 1)
uint8 = DType("uint8", 1)

_BY_NAME = {d.name: d for d in (float32, float16, float64, int64, int32, int16, int8, uint8)}


def dtype(name: str | DType) -> DType:
    """Look a dtype up by name ("float32", "f4"-style names are not accepted)."""
    if isinstance(name, DType):
        return name
    try:
        return _BY_NAME[str(name)]
    except KeyError:
        raise ValueError(f"unsupported dtype {name!r}; known: {sorted(_BY_NAME)}") from None
