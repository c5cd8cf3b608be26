"""Serve plotly.js from the site itself: the copy inside the installed `plotly` package, so the
figures' JSON and the library that draws them always come from the same release.

It is added as a generated site file (`assets/vendor/plotly/plotly.min.js`), so both
`mkdocs build` and `mkdocs serve` have it, and nothing of ~5 MB is committed.
"""

from __future__ import annotations

from importlib.resources import files as package_files

from mkdocs.structure.files import File, Files

PLOTLY_URI = "assets/vendor/plotly/plotly.min.js"  # overrides/main.html loads this path


def on_files(files: Files, config) -> Files:
    source = package_files("plotly") / "package_data" / "plotly.min.js"
    if not source.is_file():
        raise FileNotFoundError(f"plotly.js not found at {source}; is the 'plotly' package installed?")
    # A stale copy under docs/ (git-ignored) would collide with ours: the package wins.
    if (stale := files.get_file_from_path(PLOTLY_URI)) is not None:
        files.remove(stale)
    files.append(File.generated(config, PLOTLY_URI, abs_src_path=str(source)))
    return files
