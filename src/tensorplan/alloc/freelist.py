"""ggml-alloc's dynamic allocator (`ggml_dyn_tallocr`) on plain ints: offsets, no memory.

A buffer is a list of chunks. Each chunk keeps its free blocks sorted by offset; the last
block is the tail (what is left above everything carved so far, up to the chunk's
capacity). Sizes are rounded up to the alignment on alloc and on free, so every block
boundary stays aligned. The chunk's high-water mark is its planned size.

Rules as ggml-alloc has them: best fit among non-tail blocks, "<="
so the highest offset wins a tie, and a later chunk's fit overrides an earlier chunk's;
else the tail whose chunk grows least (or not at all); else a new chunk. Blocks are carved
from the front and merged with both neighbours on free. Unlike ggml there is no limit on
free blocks or chunks.
"""

from __future__ import annotations


def align_up(size: int, alignment: int) -> int:
    return -(-size // alignment) * alignment


class Chunk:
    """Free blocks of one chunk as two parallel lists sorted by offset."""

    __slots__ = ("offsets", "sizes", "max_size")

    def __init__(self, capacity: int) -> None:
        self.offsets = [0]
        self.sizes = [capacity]
        self.max_size = 0  # high-water mark: the bytes this chunk needs

    def carve(self, i: int, size: int) -> int:
        offset = self.offsets[i]
        self.offsets[i] += size
        self.sizes[i] -= size
        if self.sizes[i] == 0:
            del self.offsets[i], self.sizes[i]
        self.max_size = max(self.max_size, offset + size)
        return offset

    def release(self, offset: int, size: int) -> None:
        offs, sizes = self.offsets, self.sizes
        for i in range(len(offs)):
            if offs[i] + sizes[i] == offset:  # the freed range extends block i upwards
                sizes[i] += size
                if i + 1 < len(offs) and offs[i] + sizes[i] == offs[i + 1]:
                    sizes[i] += sizes[i + 1]
                    del offs[i + 1], sizes[i + 1]
                return
            if offset + size == offs[i]:  # ... or block i downwards
                offs[i] = offset
                sizes[i] += size
                if i > 0 and offs[i - 1] + sizes[i - 1] == offset:
                    sizes[i - 1] += sizes[i]
                    del offs[i], sizes[i]
                return
        i = 0
        while i < len(offs) and offs[i] < offset:
            i += 1
        offs.insert(i, offset)
        sizes.insert(i, size)


class DynAllocator:
    """Offsets for one buffer type: `alloc` returns (chunk, offset), `free` gives them back."""

    def __init__(self, alignment: int, max_chunk_size: int) -> None:
        if alignment <= 0:
            raise ValueError(f"alignment must be positive, got {alignment}")
        self.alignment = alignment
        self.max_chunk_size = max_chunk_size
        self.chunks: list[Chunk] = []

    def alloc(self, size: int) -> tuple[int, int]:
        size = align_up(size, self.alignment)
        c, i = self._best_fit(size)
        if c < 0:
            c, i = self._best_tail(size)
        if c < 0:
            self.chunks.append(Chunk(max(size, self.max_chunk_size)))
            c, i = len(self.chunks) - 1, 0
        return c, self.chunks[c].carve(i, size)

    def free(self, chunk: int, offset: int, size: int) -> None:
        self.chunks[chunk].release(offset, align_up(size, self.alignment))

    def chunk_sizes(self) -> list[int]:
        return [ch.max_size for ch in self.chunks]

    def _best_fit(self, size: int) -> tuple[int, int]:
        best_c = best_i = -1
        for c, ch in enumerate(self.chunks):
            best_size = None  # reset per chunk: a later chunk's fit wins (ggml's loop)
            sizes = ch.sizes
            for i in range(len(sizes) - 1):
                bs = sizes[i]
                if bs >= size and (best_size is None or bs <= best_size):
                    best_c, best_i, best_size = c, i, bs
        return best_c, best_i

    def _best_tail(self, size: int) -> tuple[int, int]:
        """The tail whose chunk needs the least growth; among tails that need none, the
        one leaving the least of the high-water mark unused (ggml's reuse factor)."""
        best_c = best_i = -1
        best_reuse: int | None = None
        for c, ch in enumerate(self.chunks):
            if not ch.sizes:
                continue
            i = len(ch.sizes) - 1
            reuse = ch.max_size - ch.offsets[i] - size
            better = best_reuse is None or (
                reuse > best_reuse if best_reuse < 0 else 0 <= reuse < best_reuse
            )
            if ch.sizes[i] >= size and better:
                best_c, best_i, best_reuse = c, i, reuse
        return best_c, best_i
