"""Does `ito serve` hold against hostile clients? (Not a test: a measurement with goals.)

Starts a real `ito serve` on a free loopback port (default edge settings: 10 s to read a request,
32 connections per client address), then at once:
  flood   100 tokenless POSTs of a 1 MiB body from 127.0.0.3 (10 at a time); each should be
          answered 401 without the server reading the body
  slow    50 clients from 127.0.0.2 sending their headers one byte every 0.5 s
  health  GET /v1/health from 127.0.0.1 every 50 ms, a new connection each time, timed
and after the slow window (30 s) reports:
  - the server's RSS growth (VmRSS from /proc/PID/status, before the abuse and after it),
    plus its peak (VmHWM) for information
  - health latency p50 / p99 in ms (a failed probe counts as infinitely slow)
  - how many slow clients are still connected, and when the others were cut off
Goals: RSS growth < 50 MiB, health p99 < 100 ms, 0 slow clients held. PASS/FAIL per goal.

    .venv/bin/python benchmarks/http_abuse.py [--quick]

--quick: 20 POSTs, 10 slow clients, a 12 s window (still past the 10 s read deadline).
127.0.0.2 and 127.0.0.3 are other addresses of the loopback (Linux routes all of 127/8 there),
so each kind of client has its own per-address share, as separate hosts would.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import socket
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "api")]

MIB = 1024 * 1024
GOAL_GROWTH_MIB = 50
GOAL_P99_MS = 100
GOAL_HELD = 0


def status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/{pid}/status")


def connect(port: int, source: str, timeout: float = 10) -> socket.socket:
    sock = socket.socket()
    sock.bind((source, 0))
    sock.settimeout(timeout)
    sock.connect(("127.0.0.1", port))
    return sock


def health_once(port: int) -> float:
    """Seconds for one GET /v1/health on a new connection; inf when it fails."""
    start = time.perf_counter()
    try:
        with contextlib.closing(connect(port, "127.0.0.1", timeout=5)) as sock:
            sock.sendall(b"GET /v1/health HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        if not data.startswith(b"HTTP/1.1 200 "):
            return float("inf")
    except OSError:
        return float("inf")
    return time.perf_counter() - start


def probe(port: int, stop: threading.Event, samples: list[float], pid: int, peak: list[int]) -> None:
    while not stop.is_set():
        samples.append(health_once(port))
        with contextlib.suppress(OSError, RuntimeError):
            peak[0] = max(peak[0], status_kib(pid, "VmRSS"))
        stop.wait(0.05)


def flood_one(port: int, body: bytes) -> str:
    """One tokenless 1 MiB POST: "401" when the refusal arrived, else what went wrong."""
    head = (f"POST /v1/runs HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    try:
        with contextlib.closing(connect(port, "127.0.0.3")) as sock:
            sock.sendall(head)
            with contextlib.suppress(OSError):  # the server may close before taking the whole body
                sock.sendall(body)
            data = b""
            with contextlib.suppress(OSError):
                while chunk := sock.recv(65536):
                    data += chunk
    except OSError as exc:
        return type(exc).__name__
    if data.startswith(b"HTTP/1.1 401 ") and b"AUTH_REQUIRED" in data:
        return "401"
    return "reset before the answer" if not data else data.split(b"\r\n", 1)[0].decode(errors="replace")


def slow_clients(port: int, count: int, window_s: float, result: dict) -> None:
    """`count` clients trickling their headers; records when each was closed by the server."""
    request = b"GET /v1/health HTTP/1.1\r\nHost: bench\r\nX-Padding: " + b"p" * 4096 + b"\r\n\r\n"
    start = time.monotonic()
    open_socks: dict[socket.socket, int] = {}
    closed_at: list[float] = []
    for _ in range(count):
        try:
            sock = connect(port, "127.0.0.2")
            sock.setblocking(False)
            open_socks[sock] = 0
        except OSError:
            closed_at.append(time.monotonic() - start)
    while time.monotonic() - start < window_s:  # the whole window, so health is timed throughout
        if not open_socks:
            time.sleep(0.5)
            continue
        for sock in list(open_socks):
            sent = open_socks[sock]
            try:
                sock.send(request[sent:sent + 1])
                open_socks[sock] = min(sent + 1, len(request) - 1)  # never finish the request
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                closed_at.append(time.monotonic() - start)
                del open_socks[sock]
                sock.close()
        readable = select.select(list(open_socks), [], [], 0.5)[0] if open_socks else []
        for sock in readable:
            try:
                if sock.recv(65536):
                    continue  # a 408 first; the close follows
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                pass
            closed_at.append(time.monotonic() - start)
            del open_socks[sock]
            sock.close()
    result["held"] = len(open_socks)
    result["closed_at"] = sorted(closed_at)
    for sock in open_socks:
        sock.close()


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20 POSTs, 10 slow clients, a 12 s window")
    args = parser.parse_args()
    num_posts, num_slow, window_s = (20, 10, 12.0) if args.quick else (100, 50, 30.0)
    from api_harness import Server

    with tempfile.TemporaryDirectory(prefix="ito-abuse-") as folder:
        server = Server(Path(os.path.realpath(folder)))
        try:
            port = int(server.url.rsplit(":", 1)[1])
            pid = server.process.pid
            for _ in range(20):  # warm: imports, thread pool, first connections
                health_once(port)
            quiet = []
            for _ in range(40):  # health without abuse, for comparison
                quiet.append(health_once(port))
                time.sleep(0.05)
            rss_before = status_kib(pid, "VmRSS")
            stop, samples, peak = threading.Event(), [], [rss_before]
            prober = threading.Thread(target=probe, args=(port, stop, samples, pid, peak), daemon=True)
            slow: dict = {}
            slow_thread = threading.Thread(target=slow_clients, args=(port, num_slow, window_s, slow), daemon=True)
            started = time.monotonic()
            prober.start()
            slow_thread.start()
            body = b"x" * MIB
            with ThreadPoolExecutor(max_workers=10) as pool:
                outcomes = list(pool.map(lambda _i: flood_one(port, body), range(num_posts)))
            flood_s = time.monotonic() - started
            slow_thread.join(window_s + 30)
            stop.set()
            prober.join(10)
            rss_after = status_kib(pid, "VmRSS")
            hwm = status_kib(pid, "VmHWM")
            alive = server.process.poll() is None
        finally:
            server.stop()

    growth_mib = (rss_after - rss_before) / 1024
    peak_mib = (max(peak[0], hwm) - rss_before) / 1024
    finite = [s for s in samples if s != float("inf")]
    p50_ms, p99_ms = percentile(samples, 0.5) * 1000, percentile(samples, 0.99) * 1000
    held = slow.get("held", num_slow)
    closed_at = slow.get("closed_at", [])
    tally = {outcome: outcomes.count(outcome) for outcome in sorted(set(outcomes))}

    print(f"ito serve abuse benchmark ({'quick' if args.quick else 'full'}): {num_posts} tokenless 1 MiB POSTs, "
          f"{num_slow} slow-header clients, {window_s:.0f} s window")
    print(f"  flood: {tally} in {flood_s:.2f} s")
    print(f"  server RSS: before {rss_before / 1024:.1f} MiB, after {rss_after / 1024:.1f} MiB, "
          f"growth {growth_mib:+.1f} MiB (peak growth {peak_mib:+.1f} MiB)")
    print(f"  health, no abuse: p50 {percentile(quiet, 0.5) * 1000:.1f} ms, "
          f"p99 {percentile(quiet, 0.99) * 1000:.1f} ms")
    print(f"  health under abuse: {len(samples)} probes, {len(samples) - len(finite)} failed, p50 {p50_ms:.1f} ms, "
          f"p99 {p99_ms:.1f} ms, max {max(finite) * 1000 if finite else float('inf'):.1f} ms")
    cut = [t for t in closed_at if t >= 1.0]
    print(f"  slow clients: {held} still connected after {window_s:.0f} s; {len(closed_at) - len(cut)} closed at "
          f"once (per-address limit), {len(cut)} cut at "
          f"{min(cut):.1f}-{max(cut):.1f} s (read deadline)" if cut else
          f"  slow clients: {held} still connected after {window_s:.0f} s; {len(closed_at)} closed at once")
    print(f"  server still running: {alive}")
    goals = [
        (f"RSS growth {growth_mib:+.1f} MiB < {GOAL_GROWTH_MIB} MiB", growth_mib < GOAL_GROWTH_MIB),
        (f"health p99 {p99_ms:.1f} ms < {GOAL_P99_MS} ms", p99_ms < GOAL_P99_MS),
        (f"slow clients held {held} == {GOAL_HELD}", held == GOAL_HELD),
    ]
    for text, passed in goals:
        print(f"  {'PASS' if passed else 'FAIL'}  {text}")
    return 0 if all(passed for _text, passed in goals) and alive else 1


if __name__ == "__main__":
    sys.exit(main())
