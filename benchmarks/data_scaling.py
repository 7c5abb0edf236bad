"""Data stages that scale: peak memory and throughput of deduplication + decontamination +
cleaning as the corpus grows, and with 1 and 2 worker processes.

Corpora of 1x, 4x, 16x, 64x and 128x the fixture corpus (data/fixtures/corpora, ~3k documents,
~1.7 MB) are generated into a temporary folder: copy 0 is the fixtures themselves (with their
planted eval items and reposts); every further copy of a fixture document is an exact copy (5%),
a near copy with 1-20% of its words dropped, replaced or inserted (20%), or a new document of
fixture sentences about as long as the one it stands for (75%), so that a k-x corpus has ~k times
the fixtures' documents and bytes, and every stage does real work at every size. Standard library
only; nothing is downloaded.

The corpus is one JSONL source named by a manifest (fixture-small's, its data replaced), and
runs are fresh subprocesses:
- "units": the stages themselves (`stages.run_sources`, `run_dedup`, `run_decontam`,
  `run_clean`, lineage tables included, then the independent re-scan of the blocking check
  `zero_residual_contamination`), each in a subprocess of its own, as Dagster's multiprocess
  executor (the default) and its Kubernetes executor run each step; results pass between them as
  pickles, as through Dagster's IO manager. Its peak is the largest stage's. Sources are parsed
  from a verified snapshot a batch at a time; deduplication and decontamination run over work
  units, DuckDB under its cap holds ids, hashes and per-document decisions, `bucket_sort` puts
  text into keep order. With 1 or 2 worker processes;
- "memory": the in-memory path they replaced (`sources.read_sources`, then `deduplicate` and
  `scan` of the reference implementation, tests/reference_impl.py, and `clean.clean_documents`,
  all on whole frames), in one subprocess (its peak is its deduplication's, which holds the whole
  corpus, whichever process runs it), the baseline in the same run, up to `--memory-up-to` (64x:
  it held 1.5 GB there and grows ~linearly; at 128x it would hold ~2.8 GB and add ~2 minutes to a
  run of ~8).
- a paper projection to 1 B documents (`projection`, its assumptions in its docstring), from the
  largest local one-worker run's split between work-unit phases and global steps;
- "ray": the units path with ITO_DATA_ENGINE's "ray" (`--ray-at`): the stage subprocesses join a Ray
  started by the benchmark on this machine with 1 and with 2 CPUs (`ray start --head`; the stages
  connect through RAY_ADDRESS, as on a cluster), each work unit one Ray task; compared with the
  local engine's 1 and 2 workers at the same size: its overhead and that the clean shards are the
  same bytes. Ray's workers are not the stage's children: their peak is the largest VmHWM among
  the cluster's worker processes (`ray::…` in /proc) at the end of each stage, read before the
  stage disconnects (Ray ends a job's workers with its driver), the largest over the stages.
A third kind of subprocess only imports the libraries: its peak RSS is the fixed baseline (the
interpreter with polars, pyarrow, DuckDB and numpy loaded), so that what the data costs shows.
Peak RSS is the subprocess's own high-water mark (VmHWM) and, for worker processes, the largest
worker's (getrusage RUSAGE_CHILDREN after the pool has exited). One polars thread per process
(POLARS_MAX_THREADS=1), so that 2 workers means 2 cores.

The stage path runs under a ScaleConfig scaled to the fixtures (`BENCH_SCALE`): units (and sort
buckets) of 1 MiB, so that even 1x is several units, DuckDB capped at 128 MB (its floor for one
thread), and candidate pairs verified 1,024 at a time; shards of 50,000 rows (the stages'
default `shard_max_rows`). Its peak is then baseline + DuckDB's memory (up to its cap, plus what
its allocator keeps until the step reconnects) + one shard being written + one unit's and one
batch's work + what still grows with the corpus: a few bytes a document (the near-duplicates'
positions, the units' shingle offsets). The verdict compares the two largest sizes: "bounded"
when the data-dependent part grows by at most `BOUNDED_FACTOR` while the corpus doubles or more.

    .venv/bin/python benchmarks/data_scaling.py [--scales 1 4 16 64] [--workers-at 16] [--ray-at 16 64] [--out benchmarks/results/data_scaling.json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pickle
import random
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.append(str(ROOT / "tests"))  # reference_impl

from ito_assets.data.config import ScaleConfig  # noqa: E402

SUITE = ROOT / "data" / "fixtures" / "evals" / "ito-fixture-evals-v1.jsonl"
MANIFEST = ROOT / "data" / "fixtures" / "manifests" / "fixture-small.json"
# Rows per Parquet shard: the stages' default (DataPrepConfig.shard_max_rows).
SHARD_ROWS = 50_000
UNIT_STAGES = ("sources", "decontam", "dedup", "clean", "check")
BENCH_SCALE = {"unit_bytes": 2**20, "memory_limit_mb": 128, "pair_batch": 1024}
# The stage path counts as bounded when its data-dependent peak (peak - baseline) grows by at
# most this factor between the two largest sizes (the corpus doubling or more): held text would
# grow it 2x or more; 1.2 leaves room for run-to-run noise on a shared machine and for the
# per-document ids and decisions, which do grow (tens of bytes a document).
BOUNDED_FACTOR = 1.2


def generate(scale: int, seed: int = 0) -> list[str]:
    import dedup_corpus

    rng = random.Random(seed)
    base = dedup_corpus.fixture_texts()
    sentences = [s for t in base for s in dedup_corpus._SENTENCE.split(t) if len(s.split()) >= 4]
    texts = list(base)
    for _ in range(scale - 1):
        for text in base:
            roll = rng.random()
            if roll < 0.05:
                texts.append(text)
            elif roll < 0.25:
                texts.append(dedup_corpus._edit(rng, text, rng.uniform(0.01, 0.2)))
            else:
                texts.append(_like(rng, sentences, len(text.split())))
    rng.shuffle(texts)
    return texts


def _like(rng: random.Random, sentences: list[str], num_words: int) -> str:
    """A new document of fixture sentences, about as long as the fixture document it stands for."""
    out: list[str] = []
    while sum(len(s.split()) for s in out) < num_words:
        out.append(rng.choice(sentences))
    return " ".join(out)


def write_corpus(texts: list[str], folder: Path) -> str:
    """The texts as one JSONL source under `folder` (the data root) and a manifest that names it
    (fixture-small's, with its data replaced) -> the manifest's path."""
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / "bench.jsonl"
    source.write_bytes("".join(json.dumps({"id": str(i), "text": t}) + "\n" for i, t in enumerate(texts)).encode())
    manifest = json.loads(MANIFEST.read_text())
    provenance = manifest["data"][0]["decontamination"]
    manifest["data"] = [{"uri": "dataroot://bench.jsonl", "sha256": hashlib.sha256(source.read_bytes()).hexdigest(), "license": "CC0-1.0", "format": "jsonl", "decontamination": provenance}]
    path = folder / "manifest.json"
    path.write_text(json.dumps(manifest, sort_keys=True))
    return str(path)


def scales_or_child(child: Callable[[dict], dict]) -> argparse.Namespace | None:
    """A comparison benchmark's arguments (--scales, default 64 and 128; --out; `load`: the load
    average at the start), or, in one of its children (--child SPEC), None once `child(spec)` has
    run and its JSON is printed."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--scales", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--child")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return None
    args.load = os.getloadavg()[0]
    return args


def corpora(scales: list[int], prefix: str) -> Iterator[tuple[int, list[str], Path, str]]:
    """Each scale's generated corpus, written under a temporary folder removed after: (scale, its
    texts, its folder, the manifest naming it)."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        for scale in scales:
            texts, folder = generate(scale), Path(tmp) / f"x{scale}"
            yield scale, texts, folder, write_corpus(texts, folder / "corpus")


def run_script_child(script: str, spec: dict) -> dict:
    """`script --child <spec as JSON>` in a fresh process with one polars and one OpenMP thread
    -> the JSON of its last line (a failed child stops the benchmark with its error)."""
    env = {**os.environ, "POLARS_MAX_THREADS": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, script, "--child", json.dumps(spec)], capture_output=True, text=True, env=env, check=False)
    if done.returncode:
        raise SystemExit(f"{Path(script).name} child failed ({spec}):\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def add_run(rows: list[dict], script: str, row: dict, spec: dict) -> None:
    """`row` with the figures of `script`'s child run on `spec` appended to `rows`, and printed
    as it comes (without the shard digests)."""
    rows.append({**row, **run_script_child(script, spec)})
    print(json.dumps({k: v for k, v in rows[-1].items() if k != "shards"}), flush=True)


def runs_on_upstream(script: str, scales: list[int], prefix: str, configs: tuple[tuple[str, int], ...]) -> list[dict]:
    """A stage's configurations on the same upstream results: per scale, `script`'s child with
    `upstream_only` pickles the stages before it once (its JSON joins each row), then a child per
    (label, workers) of `configs` runs the stage on them -> the rows, printed as they come."""
    rows: list[dict] = []
    for scale, texts, folder, manifest in corpora(scales, prefix):
        pickled = str(folder / "upstream.pickle")
        found = run_script_child(script, {"upstream_only": True, "manifest": manifest, "work": str(folder / "upstream"),
                                          "upstream": pickled})
        for index, (label, workers) in enumerate(configs):
            spec = {"upstream": pickled, "workers": workers, "work": str(folder / f"run-{index}")}
            add_run(rows, script, {"scale": scale, "num_docs": len(texts), **found, "config": label}, spec)
    return rows


# The columns a run that writes shards ends its table with, after its own (`report_shards`).
_SHARD_RUN_COLUMNS: dict[str, Callable[[dict], object]] = {
    "shards s": lambda r: r["shard_seconds"] or "-", "speedup": lambda r: f"{r['speedup']}x", "peak MB": lambda r: r["peak_rss_mb"],
    "worker peak MB": lambda r: r["worker_peak_rss_mb"] or "-", "same shards": lambda r: r["same_shards"]}


def report_shards(args: argparse.Namespace, rows: list[dict], columns: dict[str, Callable[[dict], object]], differs: str) -> None:
    """`report` for runs that write shards (`shards`: their digests; `seconds`, `shard_seconds`,
    `peak_rss_mb`, `worker_peak_rss_mb`), each against the scale's first run: `columns` are the
    benchmark's own, before the shared ones."""
    report(args, rows, speedups={"speedup": "seconds"}, same=("same_shards", "shards"), columns=columns | _SHARD_RUN_COLUMNS,
           differs=differs)


def report(args: argparse.Namespace, rows: list[dict], *, speedups: dict[str, str], same: tuple[str, str],
           columns: dict[str, Callable[[dict], object]], differs: str) -> None:
    """A comparison benchmark's ending: each row against its scale's baseline (`_against_baseline`),
    the rows as a Markdown table ({header: the cell of a row}), and, with `--out`, a results file,
    dated, with the load average at the start; then, unless every configuration wrote the
    baseline's bytes, the benchmark fails saying `differs`."""
    same_everywhere = _against_baseline(rows, speedups, same)
    print("\n| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for row in rows:
        print("| " + " | ".join(str(cell(row)) for cell in columns.values()) + " |")
    if args.out:
        args.out.write_text(json.dumps({"rows": rows, "date": time.strftime("%Y-%m-%d"), "load_average_at_start": args.load}, indent=1))
    if not same_everywhere:
        raise SystemExit(differs)


def _against_baseline(rows: list[dict], speedups: dict[str, str], same: tuple[str, str]) -> bool:
    """Per scale, each row against the scale's first (the baseline): `speedups` {new key: seconds
    key} as the baseline's seconds over the row's, and `same` (new key, key) whether the row's
    value is the baseline's. -> whether every row's is."""
    for scale in dict.fromkeys(r["scale"] for r in rows):
        runs = [r for r in rows if r["scale"] == scale]
        for run in runs:
            run.update({name: round(runs[0][key] / run[key], 2) for name, key in speedups.items()})
            run[same[0]] = run[same[1]] == runs[0][same[1]]
    return all(r[same[0]] for r in rows)


def peak_rss_mb() -> tuple[float, float]:
    """(this process's peak RSS, the largest waited-for child's), in MB."""
    status = Path("/proc/self/status").read_text()
    hwm = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:"))
    return hwm / 1024, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def imports() -> None:
    """Everything the chain imports, nothing run: the baseline child measures only this."""
    import duckdb  # noqa: F401
    import numpy  # noqa: F401
    import polars  # noqa: F401
    import pyarrow.parquet  # noqa: F401

    from ito_assets.data import clean, dedup_units, decontam_units, stages  # noqa: F401
    from ito_assets.evals.suite import load_suite  # noqa: F401
    from ito_assets.manifest.verify import verify_manifest  # noqa: F401


def child(manifest_path: str, mode: str, workers: int, work: Path, engine: str = "local") -> dict:
    """One subprocess's work: the baseline, the whole in-memory chain, or one stage of the units
    path (`mode` "units:<stage>")."""
    imports()
    if mode == "baseline":
        return {"peak_rss_mb": round(peak_rss_mb()[0], 1)}
    from ito_assets.data.config import DataPrepConfig
    from ito_assets.evals.suite import load_suite
    from ito_assets.manifest.verify import verify_manifest

    verified = verify_manifest(manifest_path)
    config = DataPrepConfig(scale=ScaleConfig(**BENCH_SCALE, num_workers=workers, engine=engine), shard_max_rows=SHARD_ROWS)
    if engine == "ray":  # joined here, not by the stage: a job's workers end with its driver's connection
        import ray

        ray.init(log_to_driver=False, configure_logging=False)
    suite, data_root = load_suite(SUITE), Path(manifest_path).parent
    unit_seconds = time_unit_phases() if mode.startswith("units:") else [0.0]
    start = time.perf_counter()
    if mode == "memory":
        timings: dict[str, float] = {"start": start}
        out = memory_chain(verified, data_root, work, suite, config, timings)
        phases = list(timings)
        out |= {f"{k}_seconds": round(timings[k] - timings[prev], 2) for prev, k in zip(phases, phases[1:])}
    else:
        out = units_stage(mode.split(":")[1], verified, data_root, work, suite, config)
        out["seconds"] = round(time.perf_counter() - start, 2)
        out["unit_seconds"] = round(unit_seconds[0], 2)
    main_mb, worker_mb = peak_rss_mb()
    worker = round(worker_mb, 1) if workers > 1 and engine == "local" else None
    if worker is not None:  # the pool's processes have exited: their CPU is the stage's unit work
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        out["worker_cpu_seconds"] = round(children.ru_utime + children.ru_stime, 2)
    if engine == "ray":
        worker = ray_worker_peak_mb()  # while this stage's workers still live
        ray.shutdown()
    return {**out, "peak_rss_mb": round(main_mb, 1), "worker_peak_rss_mb": worker}


def time_unit_phases() -> list[float]:
    """Wall seconds spent in the stages' work-unit phases (`map_units`: exact-copy keys,
    signatures, the band join's partitions, seed matches, hits, paraphrase candidates, and where there are several
    workers the source pieces and parts, the exact copies' and the representatives' spread and
    gathers, the kept and clean rows and shards), summed into the returned one-element list as
    they run; the rest of a stage is its global steps (parsing on one worker, DuckDB's groupings,
    the bucket sorts, the keep rule, writing shards), which run in the stage's own process."""
    from ito_assets.data import band_join, clean_units, decontam_units, dedup_units, exact_units, kept_units, paraphrase_units, source_pieces

    spent = [0.0]
    for module in (band_join, clean_units, decontam_units, dedup_units, exact_units, kept_units, paraphrase_units, source_pieces):
        module.map_units = timed(module.map_units, lambda seconds, args, kwargs: spent.__setitem__(0, spent[0] + seconds))
    return spent


def timed(function: Callable, record: Callable[[float, tuple, dict], None]) -> Callable:
    """`function`, which then calls record(seconds, args, kwargs) after each call, even one that raised."""
    def wrapper(*args, **kwargs):
        begin = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            record(time.perf_counter() - begin, args, kwargs)
    return wrapper


def units_stage(stage: str, verified, data_root, work, suite, config) -> dict:
    """One stage as its Dagster asset runs it, in a process of its own as the multiprocess
    executor runs a step (lineage included); the results pass on as pickles, as Dagster's IO
    manager passes them. "check" is the blocking check `zero_residual_contamination`."""
    from ito_assets.data import stages

    state_file, warehouse = work / "stages.pickle", work / "warehouse.duckdb"
    state = pickle.loads(state_file.read_bytes()) if state_file.exists() else {}
    if stage == "sources":
        state[stage] = stages.run_sources(verified, data_root, work, warehouse, config)
    elif stage == "decontam":
        state[stage] = stages.run_decontam(verified, suite, state["sources"], work, warehouse, config)
    elif stage == "dedup":
        state[stage] = stages.run_dedup(state["sources"], state["decontam"].actions, work, warehouse, config)
    elif stage == "clean":
        state[stage] = stages.run_clean(verified, state["sources"], state["dedup"], state["decontam"], work, warehouse, config)
    else:
        clean, dedup = state["clean"], state["dedup"]
        residual = stages.residual_contamination(clean.shards, suite, state["decontam"], config.scale)
        return {"num_removed": dedup.counts.num_removed, "num_hits": state["decontam"].counts.num_hits, "num_kept": dedup.counts.num_kept,
                "num_clean_rows": clean.conservation.num_clean_rows, "conservation_holds": clean.conservation.holds,
                "num_residual_hits": residual.height, "clean_sha256s": [s.sha256 for s in clean.shards.shards]}
    state_file.write_bytes(pickle.dumps(state))
    return {}


def run_units(manifest_path: str, workers: int, work: Path, engine: str = "local") -> dict:
    """The units path, a subprocess per stage: its peak is the largest stage's."""
    out: dict = {}
    for stage in UNIT_STAGES:
        done = run_child(manifest_path, f"units:{stage}", workers, work, engine)
        out |= {k: v for k, v in done.items() if k not in ("seconds", "unit_seconds", "peak_rss_mb", "worker_peak_rss_mb")}
        out[f"{stage}_seconds"], out[f"{stage}_peak_rss_mb"] = done["seconds"], done["peak_rss_mb"]
        out[f"{stage}_unit_seconds"] = done["unit_seconds"]
        out[f"{stage}_worker_cpu_seconds"] = done.get("worker_cpu_seconds", 0.0)
        if done["worker_peak_rss_mb"] is not None:
            out["worker_peak_rss_mb"] = max(out.get("worker_peak_rss_mb") or 0, done["worker_peak_rss_mb"])
    out["peak_rss_mb"] = max(out[f"{stage}_peak_rss_mb"] for stage in UNIT_STAGES)
    out.setdefault("worker_peak_rss_mb", None)
    out["seconds"] = round(sum(out[f"{stage}_seconds"] for stage in UNIT_STAGES if stage != "check"), 2)
    out["unit_seconds"] = round(sum(out[f"{stage}_unit_seconds"] for stage in UNIT_STAGES if stage != "check"), 2)
    out["worker_cpu_seconds"] = round(sum(out[f"{stage}_worker_cpu_seconds"] for stage in UNIT_STAGES if stage != "check"), 2)
    return out


def memory_chain(verified, data_root, work, suite, config, timings) -> dict:
    """The in-memory path the stages replaced: every step on whole frames."""
    from ito_assets.data import clean
    from ito_assets.data.eval_index import build_index
    from ito_assets.data.shards import write_shards
    from ito_assets.data.sources import read_sources
    from ito_assets.data.stages import decontam_config_for
    from reference_impl import deduplicate, kept_documents, scan

    docs, _ = read_sources(verified.manifest.data, data_root)
    timings["sources"] = time.perf_counter()
    decontam = decontam_config_for(verified, config.decontam)
    hits, scan_counts = scan(docs.select("doc_id", "text"), build_index(suite, decontam), decontam)
    actions, pieces = clean.apply_actions(docs.select("doc_id", "text"), hits, decontam)
    timings["decontam"] = time.perf_counter()
    tiers = clean.tiers_of(actions)
    decisions, counts = deduplicate(docs, config.dedup, tiers)
    kept = kept_documents(docs, decisions, tiers)
    input_ids = docs["doc_id"]
    del docs
    timings["dedup"] = time.perf_counter()
    rows = clean.clean_documents(kept, actions, pieces)
    shards = write_shards(rows, work / "clean", prefix="clean", max_rows=config.shard_max_rows)
    conservation = clean.account(input_ids, clean.decisions(decisions, hits, actions), rows)
    timings["clean"] = time.perf_counter()
    return {"num_removed": counts.num_removed, "num_hits": scan_counts.num_hits, "num_kept": counts.num_kept,
            "num_clean_rows": conservation.num_clean_rows, "conservation_holds": conservation.holds,
            "num_residual_hits": None, "clean_sha256s": [s.sha256 for s in shards.shards], "seconds": round(timings["clean"] - timings["start"], 2)}


def run_child(manifest_path: str, mode: str, workers: int, work: Path, engine: str = "local") -> dict:
    env = {**os.environ, "POLARS_MAX_THREADS": "1", "OMP_NUM_THREADS": "1"}
    spec = json.dumps({"manifest": manifest_path, "mode": mode, "workers": workers, "work": str(work), "engine": engine})
    done = subprocess.run([sys.executable, __file__, "--child", spec], capture_output=True, text=True, env=env, check=False)
    if done.returncode:
        raise SystemExit(f"child failed ({mode}, {workers} workers):\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


@contextmanager
def ray_cluster(num_cpus: int):
    """A Ray head on this machine with `num_cpus` CPUs, joined by the stages through RAY_ADDRESS."""
    ray = str(Path(sys.executable).parent / "ray")
    port = 6400 + num_cpus
    # On loopback only, so without Ray's token authentication (on by default for `ray start`).
    os.environ.update(RAY_ADDRESS=f"127.0.0.1:{port}", RAY_AUTH_MODE="disabled")
    subprocess.run([ray, "start", "--head", f"--num-cpus={num_cpus}", f"--port={port}", "--node-ip-address=127.0.0.1",
                    "--include-dashboard=false", "--disable-usage-stats"], check=True, capture_output=True,
                   env={**os.environ, "POLARS_MAX_THREADS": "1", "OMP_NUM_THREADS": "1"})
    try:
        yield
    finally:
        del os.environ["RAY_ADDRESS"], os.environ["RAY_AUTH_MODE"]
        subprocess.run([ray, "stop", "--force"], check=False, capture_output=True)


def ray_worker_peak_mb() -> float | None:
    """The largest high-water mark (VmHWM) among this machine's Ray worker processes, whose
    process title Ray sets to `ray::<task or IDLE>`."""
    peaks = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            if not (status.parent / "cmdline").read_bytes().startswith(b"ray::"):
                continue
            line = next(line for line in status.read_text().splitlines() if line.startswith("VmHWM:"))
        except (OSError, StopIteration):
            continue  # gone meanwhile, or a kernel thread
        peaks.append(int(line.split()[1]) / 1024)
    return round(max(peaks), 1) if peaks else None


def table(rows: list[dict], baseline_mb: float) -> str:
    header = f"{'scale':>5} {'docs':>7} {'MB':>6} {'path':>7} {'workers':>7} {'peak MB':>8} {'data MB':>8} {'worker MB':>9} {'source s':>8} {'dedup s':>8} {'decontam s':>10} {'clean s':>8} {'docs/s':>8}"
    lines = [header]
    for r in rows:
        worker = "" if r["worker_peak_rss_mb"] is None else f"{r['worker_peak_rss_mb']:.0f}"
        lines.append(
            f"{r['scale']:>4}x {r['num_docs']:>7} {r['corpus_mb']:>6.1f} {r['path']:>7} {r['workers']:>7} {r['peak_rss_mb']:>8.0f} {r['peak_rss_mb'] - baseline_mb:>8.0f} {worker:>9} "
            f"{r['sources_seconds']:>8.1f} {r['dedup_seconds']:>8.1f} {r['decontam_seconds']:>10.1f} {r['clean_seconds']:>8.1f} {r['docs_per_second']:>8.0f}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scales", type=int, nargs="+", default=[1, 4, 16, 64, 128])
    parser.add_argument("--memory-up-to", type=int, default=64, help="the largest scale the in-memory path runs at")
    parser.add_argument("--workers-at", type=int, default=16, help="the scale run with 1 and 2 workers")
    parser.add_argument("--ray-at", type=int, nargs="*", default=[16], help="the scales run on Ray with 1 and 2 CPUs (none: no Ray)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "data_scaling.json")
    parser.add_argument("--child")
    args = parser.parse_args()
    if args.child:
        spec = json.loads(args.child)
        print(json.dumps(child(spec["manifest"], spec["mode"], spec["workers"], Path(spec["work"]), spec["engine"])))
        return
    from dedup_speed import machine

    host = f"{machine().replace('1 used', '1 polars thread per process')}; load average {os.getloadavg()[0]:.1f} at start"
    print(host)
    baseline_mb = run_child("", "baseline", 1, Path(tempfile.gettempdir()))["peak_rss_mb"]
    print(f"baseline (interpreter + libraries imported): {baseline_mb:.0f} MB")
    rows = []
    with tempfile.TemporaryDirectory(prefix="ito-data-scaling-") as tmp:
        for scale in args.scales:
            texts = generate(scale, seed=scale)
            corpus_mb, num_docs = sum(len(t.encode()) for t in texts) / 1e6, len(texts)
            manifest_path = write_corpus(texts, Path(tmp) / f"corpus-{scale}x")
            del texts
            plans = ([("memory", 1)] if scale <= args.memory_up_to else []) + [("units", 1)] + ([("units", 2)] if scale == args.workers_at or scale in args.ray_at else []) \
                + ([("ray", 1), ("ray", 2)] if scale in args.ray_at else [])
            for mode, workers in plans:
                work = Path(tmp) / f"work-{scale}-{mode}-{workers}"
                if mode == "ray":
                    with ray_cluster(workers):
                        result = run_units(manifest_path, workers, work, engine="ray")
                else:
                    result = run_units(manifest_path, workers, work) if mode == "units" else run_child(manifest_path, mode, workers, work)
                # One digest over the clean shards' digests: the paths must write the same bytes.
                result["clean_digest"] = hashlib.sha256("".join(result.pop("clean_sha256s")).encode()).hexdigest()[:16]
                rows.append({"scale": scale, "num_docs": num_docs, "corpus_mb": round(corpus_mb, 2), "path": mode, "workers": workers, **result,
                             "docs_per_second": round(num_docs / result["seconds"], 1), "mb_per_second": round(corpus_mb / result["seconds"], 3)})
                print(table(rows[-1:], baseline_mb).splitlines()[1], flush=True)
    host += f", {os.getloadavg()[0]:.1f} at end"
    print(table(rows, baseline_mb))
    summary = summarize(rows, baseline_mb, args.workers_at)
    summary["projection"] = projection(rows)
    print(json.dumps(summary, indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {"benchmark": "data_scaling", "machine": host, "scale_config": BENCH_SCALE, "memory_path_up_to": args.memory_up_to, "baseline_rss_mb": baseline_mb, "runs": rows, "summary": summary}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


def summarize(rows: list[dict], baseline_mb: float, workers_at: int) -> dict:
    def pick(scale: int, path: str, workers: int = 1) -> dict | None:
        return next((r for r in rows if r["scale"] == scale and r["path"] == path and r["workers"] == workers), None)

    summary: dict = {"bounded_factor": BOUNDED_FACTOR, "baseline_rss_mb": baseline_mb}
    for path in ("units", "memory"):
        peaks = {s: pick(s, path)["peak_rss_mb"] for s in sorted({r["scale"] for r in rows}) if pick(s, path)}
        if not peaks:
            continue
        scales = list(peaks)
        summary[f"{path}_peak_rss_mb"] = {f"{s}x": peaks[s] for s in scales}
        summary[f"{path}_data_rss_mb"] = {f"{s}x": round(peaks[s] - baseline_mb, 1) for s in scales}
        # Growth of the data-dependent part from each size to the next.
        summary[f"{path}_data_rss_growth"] = {f"{a}x_to_{b}x": round((peaks[b] - baseline_mb) / (peaks[a] - baseline_mb), 2) for a, b in zip(scales, scales[1:])}
    # Every result must agree between the paths: the streamed path changes memory, not output.
    keys = ("num_removed", "num_hits", "num_kept", "num_clean_rows", "clean_digest")
    both = [r for r in rows if r["path"] == "units" and pick(r["scale"], "memory")]
    summary["paths_agree"] = all(tuple(pick(r["scale"], "memory")[k] for k in keys) == tuple(r[k] for k in keys) for r in both)
    summary["paths_compared_at"] = sorted({f"{r['scale']}x" for r in both}, key=lambda s: int(s[:-1]))
    summary["conservation_holds"] = all(r["conservation_holds"] for r in rows)
    summary["no_residual_contamination"] = all(r["num_residual_hits"] == 0 for r in rows if r["path"] == "units")
    one, two = pick(workers_at, "units", 1), pick(workers_at, "units", 2)
    if one and two:
        summary[f"docs_per_second_at_{workers_at}x"] = {"1_worker": one["docs_per_second"], "2_workers": two["docs_per_second"]}
        summary[f"speedup_2_workers_at_{workers_at}x"] = round(one["seconds"] / two["seconds"], 2)
    # The Ray engine against the local one at the same size and cores: overhead, and the same bytes.
    for workers in (1, 2):
        for scale in sorted({r["scale"] for r in rows if r["path"] == "ray" and r["workers"] == workers}):
            ray_run, local_run = pick(scale, "ray", workers), pick(scale, "units", workers)
            if local_run:
                summary[f"ray_overhead_{workers}_cpu_at_{scale}x"] = round(ray_run["seconds"] / local_run["seconds"] - 1, 3)
                summary[f"ray_same_bytes_{workers}_cpu_at_{scale}x"] = all(ray_run[k] == local_run[k] for k in keys)
    ray_scales = sorted({r["scale"] for r in rows if r["path"] == "ray"})
    for scale in ray_scales:
        ray_one, ray_two = pick(scale, "ray", 1), pick(scale, "ray", 2)
        if ray_one and ray_two:
            summary[f"ray_speedup_2_cpus_at_{scale}x"] = round(ray_one["seconds"] / ray_two["seconds"], 2)
    # A Ray worker's peak should not grow with the corpus: each holds one unit at a time.
    for workers in (1, 2):
        peaks = {f"{s}x": pick(s, "ray", workers)["worker_peak_rss_mb"] for s in ray_scales if pick(s, "ray", workers)}
        if len(peaks) >= 2:
            summary[f"ray_worker_peak_rss_mb_{workers}_cpu"] = peaks
    units = sorted(r["scale"] for r in rows if r["path"] == "units" and r["workers"] == 1)
    if len(units) >= 2:
        low, high = units[-2], units[-1]
        growth = round((pick(high, "units")["peak_rss_mb"] - baseline_mb) / (pick(low, "units")["peak_rss_mb"] - baseline_mb), 2)
        summary["units_bounded_between"] = f"{low}x_to_{high}x"
        summary["units_peak_rss_bounded"] = growth <= BOUNDED_FACTOR and high >= 2 * low
        summary[f"units_stage_peak_rss_mb_at_{high}x"] = {stage: pick(high, "units")[f"{stage}_peak_rss_mb"] for stage in UNIT_STAGES}
    return summary


# The projection's corpus and cluster (a paper exercise: nothing here runs at that size).
PROJECTED_DOCS = 1_000_000_000
PROJECTED_NODES = (1, 8, 64)
CORES_PER_NODE = 32
BAND_ROW_BYTES = 24  # doc int64, band int32, key uint64, unit int32 (near_dedup.band_rows)
KEY_ROW_BYTES = 60  # about: two ids, source, shard, row, length and the 128-bit hash (exact_units.KEY_SCHEMA)
PARTITION_MB = 512  # one worker's DuckDB cap (ScaleConfig.memory_limit_mb's default)


def projection(rows: list[dict]) -> dict | None:
    """1 B documents from the largest local one-worker run, and from the largest local run with
    several workers where there is one, assuming: the same documents (length, duplicate and
    contamination rates) as the generated corpus; per-document costs constant with size (this
    run's docs/s at its two largest sizes say how far that holds); nodes whose cores run as this
    VM's; the work-unit phases spread over every core of every node with no overhead (Ray's was
    measured above), the band join's partitions among them; the global steps on one core of one
    node, as today; no network time. In the one-worker run the unit work is the time in the
    work-unit phases and everything else is global (the texts' spreads and gathers, the kept
    shards, run as one pass there, count as global); in the several-worker run the unit work is
    the CPU its workers spent and the global steps are the stage's time outside its tasks (what
    stays on the step's node: DuckDB's numbering and groupings, the decisions, the lineage). The
    band rows are what the partitioned join moves (written by the signature units, one row group
    per partition, read by the partitions); the exact-copy keys are what hash-partitioning the
    exact-copy groups would have to move."""
    local = [r for r in rows if r["path"] == "units" and r.get("unit_seconds") is not None]
    one = [r for r in local if r["workers"] == 1]
    if not one:
        return None
    run = max(one, key=lambda r: r["scale"])
    from ito_assets.data.config import DedupConfig

    band_bytes = PROJECTED_DOCS * DedupConfig().bands * BAND_ROW_BYTES
    key_bytes = PROJECTED_DOCS * KEY_ROW_BYTES
    ray_peaks = [r["worker_peak_rss_mb"] for r in rows if r["path"] == "ray" and r["worker_peak_rss_mb"]]
    result = {
        **_projected(run, run["unit_seconds"], run["seconds"] - run["unit_seconds"]),
        "documents": PROJECTED_DOCS,
        "text_tb": round(PROJECTED_DOCS * run["corpus_mb"] / run["num_docs"] / 1e6, 2),
        "unit_share_of_cpu": round(run["unit_seconds"] / run["seconds"], 3),
        "band_rows_gb_shuffled": round(band_bytes / 1e9, 1),
        "band_partitions": -(-PROJECTED_DOCS * DedupConfig().bands // ScaleConfig().partition_rows),
        "exact_keys_gb_to_shuffle": round(key_bytes / 1e9, 1),
        "exact_key_partitions_of_512_mb": -(-key_bytes // (PARTITION_MB * 2**20)),
        "ray_worker_peak_rss_mb": max(ray_peaks) if ray_peaks else None,
    }
    several = [r for r in local if r["workers"] > 1 and r.get("worker_cpu_seconds")]
    if several:
        run = max(several, key=lambda r: (r["scale"], r["workers"]))
        result["from_workers_run"] = _projected(run, run["worker_cpu_seconds"], run["seconds"] - run["unit_seconds"])
    return result


def _projected(run: dict, unit_core_seconds: float, global_seconds: float) -> dict:
    """One run's unit work (core-seconds) and global steps (seconds on one process), per document
    and at PROJECTED_DOCS."""
    unit_s, global_s = unit_core_seconds / run["num_docs"], global_seconds / run["num_docs"]
    return {
        "from_run": f"{run['scale']}x, {run['num_docs']:,} documents, local engine, {run['workers']} worker{'s' if run['workers'] > 1 else ''}",
        "unit_core_seconds_per_doc": round(unit_s, 7),
        "global_seconds_per_doc": round(global_s, 7),
        "unit_core_hours": round(PROJECTED_DOCS * unit_s / 3600, 1),
        "global_hours_on_one_node": round(PROJECTED_DOCS * global_s / 3600, 1),
        "wall_hours_by_nodes": {f"{n} x {CORES_PER_NODE} cores": round(PROJECTED_DOCS * (unit_s / (n * CORES_PER_NODE) + global_s) / 3600, 1)
                                for n in PROJECTED_NODES},
    }

if __name__ == "__main__":
    main()
