"""Shared by the tests in tests/: one strict build of the site per session, served over HTTP, and
a headless Chromium to look at it.

A missing optional tool (mkdocs, Playwright, Chromium) skips the tests that need it, with the
reason. With TUTORIAL_REQUIRE_ALL=1 (set by tools/test, hence CI) it fails them instead, so a run
can never pass by skipping.
"""

from __future__ import annotations

import functools
import http.server
import importlib
import os
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def require_tool(available: bool, reason: str) -> None:
    """Unless `available`, skip the test (or the module, at import time) with `reason`; under
    TUTORIAL_REQUIRE_ALL=1 fail instead."""
    if available:
        return
    if os.environ.get("TUTORIAL_REQUIRE_ALL") == "1":
        pytest.fail(f"{reason} (TUTORIAL_REQUIRE_ALL=1: a missing tool is a failure)", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def require(module: str) -> ModuleType:
    """Import an optional dependency, or skip (fail under TUTORIAL_REQUIRE_ALL=1) if it is missing."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        require_tool(False, f"{module} is not installed ({error}); run tools/bootstrap or pip install -e '.[site,test]'")


def run_mkdocs_build(site_dir: Path, config_file: Path | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """`mkdocs build --strict` in a subprocess, with this interpreter (the project's venv)."""
    require("mkdocs")
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site_dir)]
    if config_file is not None:
        cmd += ["--config-file", str(config_file)]
    # NO_MKDOCS_2_WARNING silences Material's end-of-life banner, which would bury the real log.
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="session")
def mkdocs_build():
    """The build function itself, for tests that build a small site of their own."""
    return run_mkdocs_build


@dataclass(frozen=True)
class BuiltSite:
    root: Path
    log: str  # mkdocs' stdout and stderr

    def pages(self) -> list[str]:
        """Site-relative URLs of every HTML page ('' for the home page), e.g. 'chapters/01-gpu-hierarchy/'."""
        urls = []
        for index in sorted(self.root.rglob("index.html")):
            rel = index.parent.relative_to(self.root).as_posix()
            if rel.split("/")[0] in ("assets", "search"):
                continue
            urls.append("" if rel == "." else rel + "/")
        return urls


@pytest.fixture(scope="session")
def built_site(tmp_path_factory) -> BuiltSite:
    site_dir = tmp_path_factory.mktemp("site")
    proc = run_mkdocs_build(site_dir)
    log = proc.stdout + proc.stderr
    if proc.returncode != 0:
        pytest.fail(f"`mkdocs build --strict` failed (exit {proc.returncode}):\n{log[-8000:]}", pytrace=False)
    return BuiltSite(site_dir, log)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002  (the base class's name)
        pass


@pytest.fixture(scope="session")
def served_site(built_site: BuiltSite):
    """The built site on http://127.0.0.1:<free port>/; yields that base URL."""
    handler = functools.partial(_QuietHandler, directory=str(built_site.root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="session")
def browser():
    """Debian's Chromium driven by Playwright; never `playwright install` (it downloads a browser)."""
    sync_playwright = require("playwright.sync_api").sync_playwright
    require_tool(CHROMIUM.exists(), f"{CHROMIUM} is missing: apt-get install chromium (tools/test does that)")

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, timeout=60_000)
        try:
            yield browser
        finally:
            browser.close()
