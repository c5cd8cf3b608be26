"""Where the committed data and the site's pages are: the checkout's `data/` and `docs/`.

The kernels and the public API need neither. The benchmark harness, the recorders and the
figures read or write measurements there. In a checkout they are found beside the package;
after `pip install .` the package lives elsewhere, so set `TUTORIAL_KERNELS_DATA` (and
`TUTORIAL_KERNELS_DOCS` for the GPT's training text) to point at them. A missing folder raises
`FileNotFoundError` naming the variable to set.
"""

from __future__ import annotations

import os
from pathlib import Path

DATA_VARIABLE = "TUTORIAL_KERNELS_DATA"
DOCS_VARIABLE = "TUTORIAL_KERNELS_DOCS"

# The checkout this module sits in, if it sits in one (editable install, or run from the tree).
_CHECKOUT = Path(__file__).resolve().parent.parent


def _folder(variable: str, default: Path, what: str) -> Path:
    if os.environ.get(variable):
        path = Path(os.environ[variable])
    else:  # the checkout's folder; an installed package has none (a stray site-packages/data is not it)
        path = default if repository_root() is not None else Path("/nonexistent") / default.name
    if not path.is_dir():
        source = (f"{variable}={os.environ[variable]!r}" if os.environ.get(variable)
                  else f"the default {default}" if repository_root() is not None else "no checkout around the package")
        raise FileNotFoundError(
            f"{what}: {source} is not a directory; run from a checkout of the repository, or set "
            f"{variable} to its {default.name}/ folder"
        )
    return path


def data_dir() -> Path:
    """The folder of measurements (`data/` of the checkout, or $TUTORIAL_KERNELS_DATA)."""
    return _folder(DATA_VARIABLE, _CHECKOUT / "data", "the measurements folder")


def data_file(name: str) -> Path:
    """data_dir() / name: a file of measurements, e.g. data_file("ch05_fwd.json")."""
    return data_dir() / name


def docs_dir() -> Path:
    """The site's pages (`docs/` of the checkout, or $TUTORIAL_KERNELS_DOCS)."""
    return _folder(DOCS_VARIABLE, _CHECKOUT / "docs", "the site's pages")


def repository_root() -> Path | None:
    """The checkout the package was imported from, or None when it is installed elsewhere."""
    return _CHECKOUT if (_CHECKOUT / ".git").exists() or (_CHECKOUT / "pyproject.toml").exists() else None
