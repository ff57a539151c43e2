"""The NPZ file the mocker reads (``--planner-profile-data``), without numpy.

Uncompressed zip of ``.npy`` (format 1.0) little-endian float64 arrays in C order, written
byte-for-byte deterministically so that a profile's digest depends only on its tables.
"""

from __future__ import annotations

import io
import math
import struct
import zipfile
from pathlib import Path


def _npy_bytes(values: list[float] | list[list[float]]) -> bytes:
    """A ``.npy`` (format 1.0) image of a 1-D or 2-D little-endian float64 C-order array."""
    if values and isinstance(values[0], list):
        rows = [list(map(float, r)) for r in values]
        shape = f"({len(rows)}, {len(rows[0]) if rows else 0})"
        if any(len(r) != len(rows[0]) for r in rows):
            raise ValueError("ragged 2-D array")
        flat = [v for r in rows for v in r]
    else:
        flat = [float(v) for v in values]  # type: ignore[arg-type]
        shape = f"({len(flat)},)"
    header = f"{{'descr': '<f8', 'fortran_order': False, 'shape': {shape}, }}"
    # magic(6) + version(2) + header length(2) + header, padded with spaces so that the data
    # starts on a 64-byte boundary, newline-terminated.
    pad = (-(10 + len(header) + 1)) % 64
    header_bytes = (header + " " * pad + "\n").encode("latin1")
    return (
        b"\x93NUMPY\x01\x00"
        + struct.pack("<H", len(header_bytes))
        + header_bytes
        + struct.pack(f"<{len(flat)}d", *flat)
    )


def write_npz(path: Path, arrays: dict[str, list[float] | list[list[float]]]) -> None:
    """Write ``arrays`` as an uncompressed NPZ, byte-for-byte deterministic."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
        for name in sorted(arrays):
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.create_system = 3
            zf.writestr(info, _npy_bytes(arrays[name]))
    path.write_bytes(buf.getvalue())


def read_npz(path: Path) -> dict[str, tuple[tuple[int, ...], list[float]]]:
    """Read back an NPZ written by :func:`write_npz` (shape, flat values) per key."""
    out: dict[str, tuple[tuple[int, ...], list[float]]] = {}
    with zipfile.ZipFile(path) as zf:
        for name in zf.namelist():
            raw = zf.read(name)
            if raw[:8] != b"\x93NUMPY\x01\x00":
                raise ValueError(f"{name}: not a format-1.0 .npy")
            (hlen,) = struct.unpack("<H", raw[8:10])
            header = raw[10 : 10 + hlen].decode("latin1")
            if "'<f8'" not in header or "'fortran_order': False" not in header:
                raise ValueError(f"{name}: expected little-endian float64 in C order")
            shape_text = header.split("'shape': (", 1)[1].split(")", 1)[0]
            shape = tuple(int(p) for p in shape_text.split(",") if p.strip())
            count = math.prod(shape)
            body = raw[10 + hlen :]
            if len(body) != 8 * count or (10 + hlen) % 64:
                raise ValueError(f"{name}: bad data length or alignment")
            out[name.removesuffix(".npy")] = (shape, list(struct.unpack(f"<{count}d", body)))
    return out
