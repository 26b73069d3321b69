"""Type stub of the compiled compare kernels (ftkit/tensors/_kernels.c); see ftkit.tensors.kernels."""

from typing import Any

BLOCK: int

def diff(
    a: Any, b: Any, fmt_a: int, fmt_b: int, table_a: bytes | None, table_b: bytes | None, rtol: float, atol: float
) -> tuple[int, int, int, int, int, int, int, int, int, float, float, int, float, int, float, float]: ...
def nonfinite(a: Any, fmt: int, table: bytes | None) -> tuple[int, int]: ...
def chunk_hashes(fn: int, data: Any, chunk: int, out: Any) -> None: ...
