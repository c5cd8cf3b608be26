"""Tiles by rule: the configuration a tuned kernel launches with, read from a table measured per GPU.

Triton's autotuner finds the fastest configuration (tile sizes, warps, pipeline stages) for a shape by
compiling and timing every candidate: half a minute at the first call in a fresh process. The
tuned kernels instead look their configuration up here, compile that one, and launch:

    key                                                    → configuration
    (architecture, kernel, head_dim, causal, dtype, length bucket)   {"BLOCK_M": …, "num_warps": …, …}

The table of an architecture (`tiles_sm90.json` beside this module for Hopper, H100 and H200) holds
what the autotuner chose on that GPU over a grid of keys, with the provenance of the run that
measured it (`python -m tutorial_kernels.tuning build`). A key between the grid's points takes the
row of the nearest length bucket (in powers of two) and of the smallest measured head_dim at least
as large as the columns the kernel computes (its caller passes the padded width where the kernel pads:
a configuration that fits wider tiles fits narrower ones). A GPU whose architecture has no table, a
dtype the table does not list, and a head wider than any row get each kernel's teaching configuration.

Autotuning is an explicit step: `tutorial_kernels.tune(q, k, v, causal)`, or TUTORIAL_KERNELS_AUTOTUNE=1
for every new key of a process. Its choices are written, in the same format, to the user's table
(`user_table_path()`), which the lookup reads before the shipped one.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch

from tutorial_kernels.runtime import interpreter_active

AUTOTUNE_VARIABLE = "TUTORIAL_KERNELS_AUTOTUNE"
USER_TABLE_VARIABLE = "TUTORIAL_KERNELS_TILES"  # a folder for the user's tables (default: ~/.cache/tutorial_kernels)
SHIPPED = Path(__file__).resolve().parent
_FIELDS = ("kernel", "head_dim", "causal", "dtype", "length_bucket")
_local = threading.local()
_tables: dict[str, dict] = {}  # architecture → {(kernel, head_dim, causal, dtype, bucket): row}, shipped then user's


def architecture(device: torch.device) -> str:
    """"sm90" for an H100 or H200: the compute capability, as the table files are named."""
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm{major}{minor}"


def shipped_table_path(arch: str) -> Path:
    return SHIPPED / f"tiles_{arch}.json"


def user_table_path(arch: str) -> Path:
    """Where `tune` and TUTORIAL_KERNELS_AUTOTUNE=1 keep this user's choices for `arch`."""
    folder = os.environ.get(USER_TABLE_VARIABLE) or Path.home() / ".cache" / "tutorial_kernels"
    return Path(folder) / f"tiles_{arch}.json"


def autotuning_requested() -> bool:
    """Whether a new key is autotuned instead of looked up: inside `autotuning()`, or with
    TUTORIAL_KERNELS_AUTOTUNE=1 in the environment."""
    return getattr(_local, "autotuning", False) or os.environ.get(AUTOTUNE_VARIABLE, "") == "1"


@contextlib.contextmanager
def autotuning() -> Iterator[None]:
    """Autotune every new key inside the block (this thread)."""
    before = getattr(_local, "autotuning", False)
    _local.autotuning = True
    try:
        yield
    finally:
        _local.autotuning = before


def row_key(row: dict) -> tuple:
    """A row's key: (kernel, head_dim, causal, dtype, length_bucket)."""
    return tuple(row[f] for f in _FIELDS)


def _read(path: Path) -> list[dict]:
    """A table file's rows; none for a missing file, and none (with a warning) for one that cannot be read."""
    try:
        return json.loads(path.read_text())["rows"]
    except FileNotFoundError:
        return []
    except (OSError, ValueError, KeyError, TypeError) as error:
        warnings.warn(f"tile table {path} ignored: {error!r}", RuntimeWarning, stacklevel=2)
        return []


def table(arch: str) -> dict:
    """Every row known for `arch`: the shipped table's, then the user's fields over them (a user's pass
    that timed pointer loads only keeps the shipped row's descriptor entry)."""
    if arch not in _tables:
        rows: dict = {}
        for path in (shipped_table_path(arch), user_table_path(arch)):
            for r in _read(path):
                rows[row_key(r)] = {**rows.get(row_key(r), {}), **r}
        _tables[arch] = rows
        return rows
    return _tables[arch]


def forget() -> None:
    """Read the tables again at the next lookup (after a file changed)."""
    _tables.clear()


def lookup(arch: str, kernel: str, head_dim: int, causal: bool, dtype: torch.dtype, length_bucket: int,
           choice: str = "best") -> dict | None:
    """The configuration the table gives `kernel` for this key (`choice`: "best", or for the forward
    "pointers" / "descriptors", the fastest with that way of loading K and V), as keyword arguments
    for the launch (BLOCK_M, …, num_warps, num_stages); None where the table has no row for the
    architecture, kernel and dtype."""
    rows = [r for key, r in table(arch).items()
            if key[0] == kernel and key[2] == causal and key[3] == str(dtype).removeprefix("torch.")
            and r.get(choice)]
    if not rows:
        return None
    dim = min((r["head_dim"] for r in rows if r["head_dim"] >= head_dim), default=None)
    if dim is None:  # wider than every measured head: a smaller head's tiles may not fit
        return None
    rows = [r for r in rows if r["head_dim"] == dim]
    row = min(rows, key=lambda r: (abs(math.log2(r["length_bucket"]) - math.log2(max(length_bucket, 1))),
                                   r["length_bucket"]))
    return dict(row[choice])


def record(arch: str, rows: list[dict], path: Path | None = None) -> Path:
    """Add `rows` (each with the key's fields and at least one configuration) to the user's table for
    `arch` (or to `path`), their fields over those of a row of the same key; written atomically.
    Returns the file written."""
    path = path or user_table_path(arch)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        document = {"architecture": arch, "rows": []}
    merged = {row_key(r): r for r in document["rows"]}
    for r in rows:  # a new row's fields over the old row's: a narrower pass keeps what an earlier one found
        merged[row_key(r)] = {**merged.get(row_key(r), {}), **r}
    document["rows"] = sorted(merged.values(), key=lambda r: tuple(str(v) for v in row_key(r)))
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as f:
        json.dump(document, f, indent=1)
    os.replace(f.name, path)
    forget()
    return path


def config_dict(config) -> dict:
    """A `triton.Config` as a table row stores it."""
    return {**config.kwargs, "num_warps": config.num_warps, "num_stages": config.num_stages}


def rule(kernel: str, head_dim: int, causal: bool, dtype: torch.dtype, length_bucket: int,
         choice: str = "best") -> dict | None:
    """`lookup` on the current CUDA device's architecture; None in Triton's interpreter (no table)."""
    if interpreter_active():
        return None
    return lookup(architecture(torch.device("cuda")), kernel, head_dim, causal, dtype, length_bucket, choice)


def tuned_row(kernel: str, head_dim: int, causal: bool, dtype: torch.dtype, length_bucket: int, best,
              timings: dict | None) -> dict:
    """A table row from one autotuner pass: its choice ("best", with its median time "ms"), and where
    candidates differ in how they load K and V (USE_DESCRIPTORS), the fastest of each kind timed; no
    "best" when the launch allowed one kind only (strided K/V: pointers)."""
    row = {"kernel": kernel, "head_dim": head_dim, "causal": causal, "dtype": str(dtype).removeprefix("torch."),
           "length_bucket": length_bucket, "best": config_dict(best)}
    times = {c: t[0] for c, t in (timings or {}).items() if math.isfinite(t[0])}
    if best in times:
        row["ms"] = round(times[best], 5)
    if "USE_DESCRIPTORS" in best.kwargs:
        if len({bool(c.kwargs.get("USE_DESCRIPTORS")) for c in times}) == 1:
            del row["best"]  # one way of loading timed (the launch allowed no other): not the fastest of both
            row.pop("ms", None)
        for name, wanted in (("pointers", False), ("descriptors", True)):
            among = [c for c in times if bool(c.kwargs.get("USE_DESCRIPTORS")) == wanted]
            if among:
                fastest = min(among, key=times.get)
                row[name], row[f"{name}_ms"] = config_dict(fastest), round(times[fastest], 5)
            elif bool(best.kwargs["USE_DESCRIPTORS"]) == wanted:
                row[name] = config_dict(best)
    return row


def record_tuned(kernel: str, head_dim: int, causal: bool, dtype: torch.dtype, length_bucket: int, best,
                 timings: dict | None) -> None:
    """Keep one autotuner choice in the user's table of the current GPU (not in the interpreter)."""
    if interpreter_active():
        return
    arch = architecture(torch.device("cuda"))
    try:
        record(arch, [tuned_row(kernel, head_dim, causal, dtype, length_bucket, best, timings)])
    except OSError as error:  # the choice still serves this process; only its keeping failed
        warnings.warn(f"the tile table {user_table_path(arch)} could not be written ({error}); set "
                      f"{USER_TABLE_VARIABLE} to a writable folder", RuntimeWarning, stacklevel=2)


__all__ = ["architecture", "autotuning", "autotuning_requested", "config_dict", "forget", "lookup", "record",
           "record_tuned", "row_key", "rule", "shipped_table_path", "table", "tuned_row", "user_table_path", "AUTOTUNE_VARIABLE",
           "USER_TABLE_VARIABLE"]
