"""What a GGUF file holds, read from its header before anything is loaded: the architecture it declares
(`general.architecture`) and the shape and type of every tensor, hence its parameter count and the memory its
float32 copy takes. Nothing is dequantised, and only the header's bytes are read (the tensors' data follow it).

transformers dequantises a whole GGUF to float32 before it looks at the architecture, on the submit host where
prepare_model runs: `check_gguf` refuses an unsupported architecture or a file whose float32 copy does not fit
the host's memory first. The layout is the GGUF specification's (version 2 and 3, little-endian), with the
`gguf` package's names for value and tensor types; its own `GGUFReader` parses every value of every field into
arrays, about 13 s for the default model's header (a 49,152-token vocabulary), where skipping them takes well
under one.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

from gguf import GGMLQuantizationType, GGUFValueType

# Bytes of each fixed-size value type (strings and arrays have a length first).
_SCALAR = {GGUFValueType.UINT8: "B", GGUFValueType.INT8: "b", GGUFValueType.UINT16: "H", GGUFValueType.INT16: "h",
           GGUFValueType.UINT32: "I", GGUFValueType.INT32: "i", GGUFValueType.FLOAT32: "f", GGUFValueType.BOOL: "?",
           GGUFValueType.UINT64: "Q", GGUFValueType.INT64: "q", GGUFValueType.FLOAT64: "d"}
# The float32 copy and the dequantised tensors it is built from exist at once while transformers loads a GGUF.
PEAK_COPIES = 2


class GGUFHeaderError(ValueError):
    """A file that is not a GGUF file this reader understands."""


@dataclass(frozen=True)
class GGUFHeader:
    architecture: str
    n_parameters: int  # elements of every tensor
    n_tensors: int
    tensor_types: tuple[str, ...]  # the distinct quantisation types, e.g. ("F32", "Q4_1")

    @property
    def float32_bytes(self) -> int:
        return 4 * self.n_parameters


class _Reader:
    def __init__(self, file, path: Path):
        self.file, self.path = file, path

    def take(self, fmt: str):
        size = struct.calcsize("<" + fmt)
        data = self.file.read(size)
        if len(data) != size:
            raise GGUFHeaderError(f"{self.path}: the GGUF header ends early (the file is cut short)")
        return struct.unpack("<" + fmt, data)[0]

    def string(self) -> str:
        length = self.take("Q")
        data = self.file.read(length)
        if len(data) != length:
            raise GGUFHeaderError(f"{self.path}: the GGUF header ends early (the file is cut short)")
        return data.decode("utf-8", errors="replace")

    def skip(self, kind: int, count: int = 1) -> None:
        """Skip `count` values of type `kind` (arrays of strings: each string's length is read)."""
        if kind in _SCALAR:
            self.file.seek(count * struct.calcsize("<" + _SCALAR[kind]), os.SEEK_CUR)
        elif kind == GGUFValueType.STRING:
            for _ in range(count):
                self.file.seek(self.take("Q"), os.SEEK_CUR)
        elif kind == GGUFValueType.ARRAY:
            for _ in range(count):
                inner, n = self.take("I"), self.take("Q")
                self.skip(inner, n)
        else:
            raise GGUFHeaderError(f"{self.path}: unknown GGUF value type {kind}")


def read_gguf_header(path: str | Path) -> GGUFHeader:
    """The header of the GGUF file at `path` (see the module docstring); GGUFHeaderError if it is not one."""
    path = Path(path)
    with open(path, "rb") as file:
        reader = _Reader(file, path)
        if file.read(4) != b"GGUF":
            raise GGUFHeaderError(f"{path}: not a GGUF file (it does not start with 'GGUF')")
        version = reader.take("I")
        if version not in (2, 3):
            raise GGUFHeaderError(f"{path}: GGUF version {version}; versions 2 and 3 (little-endian) are read")
        n_tensors, n_kv = reader.take("Q"), reader.take("Q")
        architecture = None
        for _ in range(n_kv):
            key, kind = reader.string(), reader.take("I")
            if key == "general.architecture" and kind == GGUFValueType.STRING:
                architecture = reader.string()
            else:
                reader.skip(kind)
        n_parameters, types = 0, set()
        for _ in range(n_tensors):
            reader.string()  # the tensor's name
            n_dims = reader.take("I")
            elements = 1
            for _ in range(n_dims):
                elements *= reader.take("Q")
            kind = reader.take("I")
            reader.take("Q")  # the offset of its data
            n_parameters += elements
            try:
                types.add(GGMLQuantizationType(kind).name)
            except ValueError:  # a type newer than this gguf package: its count is still right
                types.add(str(kind))
    if architecture is None:
        raise GGUFHeaderError(f"{path}: the GGUF header has no general.architecture")
    return GGUFHeader(architecture, n_parameters, n_tensors, tuple(sorted(types)))


def available_memory() -> tuple[int, str] | None:
    """(bytes this process may still allocate, where that figure comes from): the least of the kernel's
    MemAvailable and what the memory limits of this process's control groups (v2 `memory.max`, v1
    `memory.limit_in_bytes`, its own and its ancestors': a login node's per-user limit) leave; None where
    neither can be read (not Linux)."""
    found = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append((int(line.split()[1]) * 1024, "MemAvailable in /proc/meminfo"))
    except OSError:
        pass
    try:
        groups = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        groups = []
    for line in groups:
        _, controllers, group = line.split(":", 2)
        if controllers == "":  # v2
            root, files = Path("/sys/fs/cgroup"), ("memory.max", "memory.current")
        elif "memory" in controllers.split(","):  # v1
            root, files = Path("/sys/fs/cgroup/memory"), ("memory.limit_in_bytes", "memory.usage_in_bytes")
        else:
            continue
        folder = root / group.lstrip("/")
        while folder.is_relative_to(root):
            try:
                limit, used = ((folder / name).read_text().strip() for name in files)
                if limit != "max" and int(limit) < 1 << 60:  # v1 writes "no limit" as a huge number
                    found.append((int(limit) - int(used), f"the memory limit of control group {folder}"))
            except (OSError, ValueError):
                pass
            if folder == root:
                break
            folder = folder.parent
    return min(found) if found else None


def memory_problem(header: GGUFHeader, path: Path) -> str | None:
    """Why dequantising the GGUF at `path` to float32 would not fit this host's memory, or None."""
    available = available_memory()
    needed = PEAK_COPIES * header.float32_bytes + path.stat().st_size
    if available is None or needed <= available[0]:
        return None
    return (f"dequantising {path} to float32 needs about {needed / 1e9:.1f} GB of memory ({header.n_parameters:,} "
            f"parameters x 4 bytes, {PEAK_COPIES} copies at once while loading, plus the file), and this host has "
            f"{available[0] / 1e9:.1f} GB available ({available[1]}): prepare the model where there is more memory "
            "(results/<model>/model can then be copied here), or give its weights as a Hugging Face directory "
            "({path: /dir/with/config.json}) or Hub id, which are not dequantised")
