"""The Ray engine: the data plane's work units as Ray tasks on a cluster of two simulated nodes on
loopback (`ray.cluster_utils.Cluster`), the same bytes as the local engine, a killed worker retried,
a unit that fails three times failing the step with a code that names it, no task of a failed step
left running, the cluster joined by RAY_ADDRESS (test_ray_connect.py: where it cannot be)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

ray = pytest.importorskip("ray", reason="Ray is not installed (the `ray` extra; `make test` installs it)")
from ray.cluster_utils import Cluster  # noqa: E402

from ito_assets.data import ray_engine  # noqa: E402
from ito_assets.data.completion import CompletionMarkers  # noqa: E402
from ito_assets.data.config import DecontamConfig, DedupConfig, ScaleConfig  # noqa: E402
from ito_assets.data.dedup_units import deduplicate_units  # noqa: E402
from ito_assets.data.decontam_units import scan_shards  # noqa: E402
from ito_assets.data.eval_index import build_index  # noqa: E402
from ito_assets.data.scratch import FINISHED, scratch_space  # noqa: E402
from ito_assets.data.shards import write_shards  # noqa: E402
from ito_assets.data.units import map_units, worker_pool  # noqa: E402
from ito_assets.errors import ErrorCode, ItoError  # noqa: E402
from reference_impl import deduplicate, scan  # noqa: E402
from test_decontam_units import ITEMS, corpus as decontam_corpus  # noqa: E402
from test_decontam import suite  # noqa: E402
from test_dedup_units import TINY, corpus as dedup_corpus  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster():
    """Two nodes of one CPU each on this machine: tasks spread over both, as on two hosts."""
    nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    nodes.add_node(num_cpus=1)
    # The task functions below live in this test module: Ray's workers import it as pytest does.
    here = Path(__file__).resolve().parent
    ray.init(address=nodes.address, log_to_driver=False, configure_logging=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(map(str, [here, here.parent, here.parents[1]]))}})
    try:
        yield nodes
    finally:
        ray.shutdown()
        nodes.shutdown()


def _on_ray(function, tasks, phase="test phase"):
    with worker_pool(1, "ray") as pool:
        assert isinstance(pool, ray_engine.RayPool)
        return map_units(function, tasks, pool, phase=phase)


# Top-level task functions: Ray ships them to its workers by reference.
def square(value: int) -> int:
    return value * value


def fails_until(task: tuple[str, int]) -> int:
    """Fails (raises) on its first `failures` attempts, counted in files: Ray retries a task in a
    new attempt, maybe on another node, so memory cannot count them."""
    folder, failures = task
    attempt = len(os.listdir(folder)) + 1
    Path(folder, f"attempt-{attempt}").touch()
    if attempt <= failures:
        raise RuntimeError("this unit's file is unreadable")
    return attempt


def dies_once(folder: str) -> int:
    """Kills its own worker process on the first attempt: a lost worker, not an exception."""
    if not os.listdir(folder):
        Path(folder, "killed").touch()
        os._exit(1)
    return 42


@pytest.mark.long  # `make test`: the chains on Ray write the local engine's bytes, in its order
def test_results_come_back_in_task_order(cluster):
    assert _on_ray(square, list(range(-15, 15))) == [v * v for v in range(-15, 15)]
    assert _on_ray(square, [7]) == [49]  # one task still goes to the cluster
    assert _on_ray(square, []) == []


def test_a_killed_worker_is_retried_and_the_result_is_the_same(cluster, tmp_path):
    assert _on_ray(dies_once, [str(tmp_path)]) == [42]
    assert (tmp_path / "killed").exists()


@pytest.mark.parametrize("failures,succeeds", [(ray_engine.ATTEMPTS - 1, True), (ray_engine.ATTEMPTS, False)])
def test_a_unit_gets_three_attempts_then_fails_the_step_naming_it(cluster, tmp_path, failures, succeeds):
    folders = [tmp_path / "unit-0", tmp_path / "unit-1"]
    for folder in folders:
        folder.mkdir()
    tasks = [(str(folders[0]), 0), (str(folders[1]), failures)]
    if succeeds:
        assert _on_ray(fails_until, tasks, phase="dedup signatures") == [1, ray_engine.ATTEMPTS]
        return
    with pytest.raises(ItoError) as caught:
        _on_ray(fails_until, tasks, phase="dedup signatures")
    assert caught.value.code is ErrorCode.DATA_WORK_UNIT_FAILED
    assert caught.value.message == f"dedup signatures: work unit 1 failed {ray_engine.ATTEMPTS} times (RuntimeError)"
    assert "unreadable" not in caught.value.message  # a task's message may quote a document
    assert len(os.listdir(folders[1])) == ray_engine.ATTEMPTS


@dataclass(frozen=True)
class CountedTask:
    """Unit `unit`, failing on every attempt when `fails`; its attempts counted in files."""

    folder: str
    unit: int
    fails: bool

    def key(self) -> dict:
        return {"unit": self.unit}

    def inputs(self) -> tuple[str, ...]:
        return ()

    def outputs(self) -> tuple[str, ...]:
        return ()


def counted(task: CountedTask) -> int:
    folder = Path(task.folder, f"unit-{task.unit}")
    Path(folder, f"attempt-{len(os.listdir(folder)) + 1}").touch()
    if task.fails:
        time.sleep(0.5)  # the units after it finish first, on the other node
        raise RuntimeError("this unit's file is unreadable")
    return task.unit * 10


def sleeps_then_writes(task: CountedTask) -> object:
    """Unit 0 answers at once, with a result its marker cannot keep (a set): the step fails in its
    own process, as on a full disk. The other units write their file 3 s after unit 0 answered
    (however long a loaded machine took to start its worker), unless stopped first."""
    zero = Path(task.folder, "unit-0-answered")
    if task.unit == 0:
        zero.touch()
        return {0}
    waited = 0.0
    while not zero.exists() and waited < 20:
        time.sleep(0.1)
        waited += 0.1
    time.sleep(3)
    Path(task.folder, f"written-{task.unit}").touch()
    return task.unit


def test_a_step_that_fails_in_its_own_process_leaves_no_task_of_its_own_running(cluster, tmp_path):
    """On a cluster that outlives the step, a unit left running went on writing into the phase's
    folder, even into the rerun that had cleared it (a unit's file gone under its digest, the
    task retried by Ray). The error still holds the step's frames when it is raised."""
    tasks = [CountedTask(str(tmp_path), unit, False) for unit in range(4)]
    with pytest.raises(TypeError, match="set") as caught:
        with worker_pool(1, "ray") as pool:
            map_units(sleeps_then_writes, tasks, pool, phase="test phase", markers=CompletionMarkers(tmp_path / "finished"))
    # A task may end within its grace (asked to stop, then killed after STOP_WAIT_S) and leave a
    # file that no marker vouches for, which the rerun removes; none writes after the error.
    left = sorted(p.name for p in tmp_path.iterdir())
    time.sleep(5)  # past when units 1 and 2 (two CPUs) would have written
    assert caught.value and sorted(p.name for p in tmp_path.iterdir()) == left


JOIN = """
import sys
sys.path[:0] = {paths!r}
import ray._private.utils
if {release!r}:
    ours = ray._private.utils.compute_version_info()
    ray._private.utils.compute_version_info = lambda: ({release!r}, ours[1])
from ito_assets.data.units import map_units, worker_pool
from ito_assets.errors import ItoError
def negated(value):
    return -value
try:
    with worker_pool(1, "ray") as pool:
        print(map_units(negated, [-1, -2], pool, phase="test phase"))
except ItoError as error:
    print(error)
"""


def test_a_step_joins_the_cluster_ray_address_names_and_refuses_one_on_another_ray_release(cluster):
    here = Path(__file__).resolve().parent
    address = cluster.address.replace(cluster.address.rpartition(":")[0], "127.0.0.1")  # as a user writes it

    def joined(release: str) -> str:
        code = JOIN.format(paths=[str(here.parents[1])], release=release)
        env = {**os.environ, "RAY_ADDRESS": address}
        return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120).stdout.strip()

    assert joined("").splitlines()[-1] == "[1, 2]"
    refused = joined("2.59.0").splitlines()[-1]
    assert refused.startswith(f"CAPABILITY_MISSING: the Ray cluster at {address} (RAY_ADDRESS) runs another Ray or Python release")


def test_a_rerun_on_ray_resumes_from_the_units_that_finished(cluster, tmp_path):
    markers = CompletionMarkers(tmp_path / "finished")
    for unit in range(4):
        (tmp_path / f"unit-{unit}").mkdir()

    def attempt(failing: int):
        tasks = [CountedTask(str(tmp_path), unit, unit == failing) for unit in range(4)]
        with worker_pool(1, "ray") as pool:
            return map_units(counted, tasks, pool, phase="dedup signatures", markers=markers)

    with pytest.raises(ItoError, match="work unit 1 failed"):
        attempt(failing=1)  # units 0, 2 and 3 finish meanwhile, 2 and 3 after it failed once
    with pytest.raises(ItoError, match="work unit 1 failed"):  # the step's unit number, not the pool's (0)
        attempt(failing=1)
    assert attempt(failing=-1) == [0, 10, 20, 30]
    for unit in (0, 2, 3):  # finished in the first attempt, never redone
        assert len(os.listdir(tmp_path / f"unit-{unit}")) == 1
    assert len(os.listdir(tmp_path / "unit-1")) == 2 * ray_engine.ATTEMPTS + 1  # finished in the third


def test_dedup_on_ray_gives_the_in_memory_decisions(cluster, tmp_path):
    docs = dedup_corpus()
    expected, expected_counts = deduplicate(docs, DedupConfig())
    shards = write_shards(docs, tmp_path / "source", prefix="d", max_rows=37)
    # Band-join partitions of 300 band rows: several partitions, each a Ray task.
    scale = ScaleConfig(unit_bytes=TINY.unit_bytes, pair_batch=TINY.pair_batch, memory_limit_mb=128, engine="ray", partition_rows=300)
    with scratch_space(tmp_path / "_scratch", scale) as scratch:
        table, counts = deduplicate_units(scratch, shards.shards, DedupConfig(), tmp_path / "decisions.parquet")
        # On Ray each bucket of the keep order is a unit made by a task.
        assert len(list((tmp_path / FINISHED / "representative-units").glob("unit-*.parquet"))) >= 10
        assert len(list((tmp_path / FINISHED / "dedup-pairs").glob("pairs-*.parquet"))) >= 5
    assert_frame_equal(pl.read_parquet(table.path), expected)
    assert counts == expected_counts


def test_decontamination_on_ray_gives_the_in_memory_hits(cluster, tmp_path):
    docs, config = decontam_corpus(), DecontamConfig()
    expected, expected_counts = scan(docs, build_index(suite(*ITEMS), config), config)
    shards = write_shards(docs, tmp_path / "kept", prefix="k", max_rows=13)
    with scratch_space(tmp_path / "_scratch", ScaleConfig(unit_bytes=200, engine="ray")) as scratch:
        scanned = scan_shards(scratch, shards.shards, build_index(suite(*ITEMS), config), config)
        hits, counts = scanned.hits, scanned.counts
    assert_frame_equal(hits, expected)
    assert counts == expected_counts


def test_sources_parsed_in_pieces_on_ray_are_the_local_engines_shards(cluster, tmp_path, monkeypatch):
    from test_source_pieces import SMALL_PIECES, shard_digests, sources_stage, write_corpus

    root = write_corpus(tmp_path.resolve())
    local = sources_stage(root, "local", unit_bytes=SMALL_PIECES)
    sent = _sent_to_ray(monkeypatch)
    on_ray = sources_stage(root, "ray", unit_bytes=SMALL_PIECES, engine="ray")
    assert sent == ["cut_source", "parse_piece", "write_part"] and on_ray.num_pieces > 20 and local.num_pieces == 3  # one pass on one worker
    assert shard_digests(on_ray) == shard_digests(local) and on_ray.sources == local.sources


def _sent_to_ray(monkeypatch) -> list[str]:
    """The names of the unit functions whose tasks went to the cluster, as they go."""
    sent: list[str] = []
    original = ray_engine.RayPool.map_finished
    monkeypatch.setattr(ray_engine.RayPool, "map_finished", lambda pool, function, tasks: (  # the unit's function, or inside its marker's wrapper
        sent.extend(getattr(task, "function", function).__name__ for task in tasks[:1]), original(pool, function, tasks))[1])
    return sent


def _digests(result) -> dict:
    return _stage_digests(*(result.output_for_node(name) for name in ("deduplicated_documents", "contamination_report", "clean_shards")))


def _stage_digests(dedup, decontam, clean) -> dict:
    """What an auditor compares between two runs: every shard's sha256 and the conservation."""
    return {
        "dedup decisions": dedup.decisions.sha256, "kept": [s.sha256 for s in dedup.kept.shards],
        "hits": decontam.hits.sha256, "actions": decontam.actions.sha256, "pieces": decontam.pieces.sha256,
        "clean": [s.sha256 for s in clean.shards.shards], "clean decisions": clean.decisions.sha256,
        "conservation": vars(clean.conservation),
    }


def _audits(warehouse: Path) -> dict:
    """What `ito audit eval-item` and `ito audit doc` answer, for every eval item that matched and
    every document it matched (the shards' folders differ between the runs; their digests do not)."""
    import duckdb

    from ito_assets.data import lineage

    with duckdb.connect(str(warehouse), read_only=True) as con:
        items = [r[0] for r in con.execute("SELECT DISTINCT eval_item_id FROM contamination_hits ORDER BY 1").fetchall()]
        hits = {item: lineage.audit_eval_item(con, item) for item in items}
        docs = sorted({h["doc_id"] for found in hits.values() for h in found})
        answers = {doc: lineage.audit_document(con, doc) for doc in docs}
    for found in answers.values():
        for entry in found:
            for piece in entry["clean_pieces"]:
                piece["shard_path"] = Path(piece["shard_path"]).name
    assert items and docs
    return {"eval items": hits, "documents": answers}


def test_the_data_chain_through_dagster_on_ray_writes_the_local_engines_bytes(cluster, tmp_path_factory, monkeypatch):
    import dagster as dg

    from test_data_defs import FIXTURES, _materialize, _settings

    sent = _sent_to_ray(monkeypatch)
    runs = {}
    for engine in ("local", "ray"):
        settings = _settings(tmp_path_factory.mktemp(engine).resolve(), FIXTURES).with_overrides(data_engine=engine)
        with dg.instance_for_test() as instance:
            _, result = _materialize(settings, instance)
            assert result.success
            runs[engine] = _digests(result) | {"audit": _audits(settings.warehouse_path)}
        assert set(sent) == (set() if engine == "local" else {"cut_source", "parse_piece", "write_part", "key_shard", "signature_unit", "anchor_bounds", "partition_pairs", "match_unit", "hits_unit", "clean_shard", "spread_shard", "compare_partition", "representative_unit", "kept_part"})
    assert runs["ray"] == runs["local"]
    assert runs["local"]["conservation"]["problems"] == ()


@pytest.mark.long
def test_a_generated_16x_corpus_on_ray_writes_the_local_engines_bytes(cluster, tmp_path, monkeypatch):
    """The benchmark's 16x corpus (48,656 documents; data_scaling.generate) through the four stages
    on each engine, with its units of 1 MiB: the same digests for every file an auditor compares.
    The local engine joins the band rows in one partition, Ray in five (~1M band rows)."""
    from ito_assets.data import stages
    from ito_assets.data.config import DataPrepConfig
    from ito_assets.evals.suite import load_suite
    from ito_assets.manifest.verify import verify_manifest

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from data_scaling import BENCH_SCALE, SHARD_ROWS, SUITE, generate, write_corpus

    manifest = write_corpus(generate(16, seed=16), tmp_path / "corpus")
    verified, suite, data_root = verify_manifest(manifest), load_suite(SUITE), Path(manifest).parent
    sent = _sent_to_ray(monkeypatch)
    digests = {}
    for engine in ("local", "ray"):
        partition_rows = 200_000 if engine == "ray" else ScaleConfig().partition_rows
        config = DataPrepConfig(scale=ScaleConfig(**BENCH_SCALE, engine=engine, partition_rows=partition_rows), shard_max_rows=SHARD_ROWS)
        work = tmp_path / engine
        warehouse = work / "warehouse.duckdb"
        sources = stages.run_sources(verified, data_root, work, warehouse, config)
        decontam = stages.run_decontam(verified, suite, sources, work, warehouse, config)
        dedup = stages.run_dedup(sources, decontam.actions, work, warehouse, config)
        clean = stages.run_clean(verified, sources, dedup, decontam, work, warehouse, config)
        digests[engine] = _stage_digests(dedup, decontam, clean)
    assert sources.num_documents > 40_000 and digests["local"]["conservation"]["problems"] == ()
    assert set(sent) == {"cut_source", "parse_piece", "write_part", "key_shard", "signature_unit", "anchor_bounds", "partition_pairs", "match_unit", "hits_unit", "clean_shard", "spread_shard", "compare_partition", "representative_unit", "kept_part"}
    assert digests["ray"] == digests["local"]
