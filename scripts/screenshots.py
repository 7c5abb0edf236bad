"""Screenshots of the Dagster UI after `make run`: the asset lineage, an asset's metadata and a
run, taken with headless Chromium driven by Playwright (neither is a test dependency: the script
says what is missing and exits 2; Debian's package is `chromium`, PyPI's `playwright`).

    .venv/bin/python scripts/screenshots.py [--out docs/screenshots] [--chromium /usr/bin/chromium]

It starts `dagster-webserver` on a free loopback port against the embedded instance (`.ito/dagster`,
the one `make run` wrote), waits for it to answer, opens each page, dismisses the UI's first-visit
newsletter dialog, waits for the page's queries to settle, saves one PNG per page and stops the
server. Nothing else is started: no daemon, so no sensor ticks while it looks.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Pages worth a look, by file name: the global lineage, the stage whose charts answer "did it
# learn, and was the gate fair", and the newest run. `{run_id}` is filled in from the instance.
PAGES = {
    "lineage.png": "/asset-groups",
    "pretraining-metadata.png": "/assets/pretraining_checkpoint",
    "run.png": "/runs/{run_id}",
}
WINDOW = {"width": 1600, "height": 1000}
# The UI polls; past this long without a finished query the page is as loaded as it will be.
SETTLE_MS = 20_000
START_TIMEOUT_S = 180


def find_chromium(given: str | None) -> str | None:
    for name in ([given] if given else ["chromium", "chromium-browser", "google-chrome", "headless_shell"]):
        found = shutil.which(name) if name else None
        if found:
            return found
    return None


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until_up(url: str, server: subprocess.Popen) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"dagster-webserver exited with {server.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/server_info", timeout=5):
                return
        except OSError:
            time.sleep(1)
    raise SystemExit(f"dagster-webserver did not answer within {START_TIMEOUT_S} s")


def newest_run_id(dagster_home: Path) -> str | None:
    import dagster as dg

    os.environ["DAGSTER_HOME"] = str(dagster_home)
    with dg.DagsterInstance.get() as instance:
        runs = instance.get_runs(limit=1)
        return runs[0].run_id if runs else None


def screenshot(browser, url: str, out: Path) -> None:
    page = browser.new_page(viewport=WINDOW)
    try:
        page.goto(url, wait_until="domcontentloaded")
        try:
            page.wait_for_load_state("networkidle", timeout=SETTLE_MS)
        except Exception:  # a page that keeps polling: take it as it is
            pass
        skip = page.get_by_role("button", name="Skip")
        if skip.count():
            skip.first.click()
        page.wait_for_timeout(1_000)
        page.screenshot(path=str(out))
    finally:
        page.close()
    if not out.is_file() or out.stat().st_size == 0:
        raise SystemExit(f"Chromium wrote no picture of {url}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
    parser.add_argument("--chromium", default=None, help="the browser to use (default: the first on PATH)")
    parser.add_argument("--dagster-home", type=Path, default=ROOT / ".ito" / "dagster")
    args = parser.parse_args(argv)

    chromium = find_chromium(args.chromium)
    if chromium is None:
        print("no headless Chromium found (Debian: apt-get install chromium); nothing taken", file=sys.stderr)
        return 2
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        print("Playwright is not installed (pip install playwright); nothing taken", file=sys.stderr)
        return 2
    if not (args.dagster_home / "dagster.yaml").is_file():
        print(f"no Dagster instance at {args.dagster_home}: run `make run` first", file=sys.stderr)
        return 2
    run_id = newest_run_id(args.dagster_home)
    args.out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "DAGSTER_HOME": str(args.dagster_home)}
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "dagster-webserver"), "-w", str(ROOT / "workspace.yaml"),
         "-h", "127.0.0.1", "-p", str(port)],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        wait_until_up(url, server)
        with sync_playwright() as driver:
            browser = driver.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
            for name, path in PAGES.items():
                if "{run_id}" in path and run_id is None:
                    print(f"skipped {name}: the instance has no run yet")
                    continue
                screenshot(browser, url + path.format(run_id=run_id), args.out / name)
                print(f"{args.out / name}: {url + path.format(run_id=run_id)}")
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
