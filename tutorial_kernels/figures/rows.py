"""Reading measurements: the committed data files of `data/` and the rows in them.

A benchmark file (written by `tutorial_kernels.bench`) holds "results" rows, one per provider and
shape, each with a "status" ("ok" or why there is no number), a "provider_key" and its readable
"provider"; "provenance" says where and how it was measured. The data folder is
`tutorial_kernels.paths.data_dir()`.
"""

from __future__ import annotations

import json
from collections import Counter

from tutorial_kernels.paths import data_dir, data_file


def current_label(label: str) -> str:
    """A provider's name as the site shows it now: files measured before the Hopper kernels became
    chapter 7's recorded them as chapter 5's."""
    if "(ch. 5)" in label and any(word in label for word in ("Hopper", "Gluon", "FA3")):
        return label.replace("(ch. 5)", "(ch. 7)")
    return label


def load_data(name: str) -> dict:
    """A committed benchmark file, e.g. `load_data("ch02_sweep")` reads data/ch02_sweep.json, with its
    providers' names as the site shows them now (`current_label`)."""
    data = json.loads(data_file(f"{name}.json").read_text())
    for row in data.get("results", []):
        if isinstance(row.get("provider"), str):
            row["provider"] = current_label(row["provider"])
    return data


def load_optional(name: str, given):
    """`given` if it is a dict; None for `False`; otherwise data/<name>.json, or None if it does not exist."""
    if given is False:
        return None
    if given is not None:
        return given
    return load_data(name) if data_file(f"{name}.json").exists() else None


def ok_rows(data: dict, **match) -> list[dict]:
    """The measured rows (status "ok") whose fields equal `match`, e.g. `ok_rows(data, provider_key="eager")`."""
    return [r for r in data["results"] if r["status"] == "ok" and all(r[k] == v for k, v in match.items())]


def provider_keys(data: dict) -> list[str]:
    """The file's provider keys, in the order of their first row."""
    return list(dict.fromkeys(r["provider_key"] for r in data["results"]))


def provider_label(data: dict, key: str) -> str:
    """Provider `key`'s readable name, as the file records it."""
    return next(r["provider"] for r in data["results"] if r["provider_key"] == key)


def run_ceiling(data: dict, rows: list[dict]) -> float:
    """The fp16 matmul ceiling of the run that measured most of `rows` (rows kept by --append carry
    the index of their run in "earlier_runs"; the newest run's rows carry none)."""
    runs = Counter(r.get("run") for r in rows)
    run = runs.most_common(1)[0][0] if runs else None
    source = data if run is None else data["earlier_runs"][run]
    return source["ceilings"]["matmul_fp16_tflops"]


def providers_by_file() -> dict[str, list[str]]:
    """The provider keys of every data file that has them, by file name: the providers one figure can
    show together (`style.colour_clashes(providers_by_file())` checks that their colours differ)."""
    out = {}
    for path in sorted(data_dir().glob("*.json")):
        data = json.loads(path.read_text())
        keys = [r["provider_key"] for r in data.get("results", []) if isinstance(r, dict) and "provider_key" in r]
        if keys:
            out[f"data/{path.name}"] = list(dict.fromkeys(keys))
    return out
