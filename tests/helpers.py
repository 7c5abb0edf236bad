"""Test builders: canary secrets, a valid manifest document, safely written files, and an
isolated embedded installation (its own data root, eval suite, manifests and state dir)."""

from __future__ import annotations

import contextlib
import copy
import json
import hashlib
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator

from ito_assets.settings import Settings

# Canaries of each secret family; tests assert none of them ever reaches an output.
CANARIES = {
    "aws": "AKIAZZCANARY0000TEST",
    "github": "ghp_CANARYcanary0123456789abcdefghijABCD",
    "github_fine": "github_pat_11CANARY0123456789_abcdefghijklmnopqrstuvwxyzABCDEFGHIJ",
    "hugging_face": "hf_CANARYcanaryCANARYcanaryCANARYcan",
    "pem": "-----BEGIN RSA PRIVATE KEY-----\nMIIcanary\n-----END RSA PRIVATE KEY-----",
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJjYW5hcnkifQ.c2lnbmF0dXJlY2FuYXJ5",
    "bearer": "Bearer CANARYtoken0123456789abcdef",
    "url": "https://canaryuser:CanaryPassw0rd@example.invalid/data.jsonl",
    "slack": "xoxb-0000000000-CANARYslacktoken",
    "entropy": "Zq8XvK2mP9wL4rT7yB3nJ6hF1dG5sA0cQeRuIoP",
}

_BASE = {
    "schema_version": 1,
    "name": "unit-test",
    "model": {"size": "tiny", "num_parameters": 1000000, "revision": "r1"},
    "data": [
        {
            "uri": "dataroot://fixtures/corpora/example.jsonl",
            "sha256": "0" * 63 + "1",
            "license": "CC0-1.0",
            "format": "jsonl",
            "decontamination": {
                "eval_suite_id": "ito-fixture-evals-v1",
                "eval_suite_sha256": "sha256:" + "a" * 64,
                "method": "ngram",
                "ngram_size": 13,
            },
        }
    ],
    "training_target": {
        "num_tokens": 300,
        "stages": [
            {"name": "pretraining", "num_tokens": 200, "sequence_length": 128},
            {"name": "mid_training", "num_tokens": 100, "sequence_length": 128},
        ],
    },
    # RLVR alone: SFT and DPO bind pair files, which gate 5 reads (tests that need them bind the
    # fixtures' files, e.g. `bound_pair_steps`).
    "post_training": [{"kind": "rlvr"}],
    "budget": {"cap_cents": 100000, "max_incremental_cents": 50000},
    "checkpoint_policy": {"interval_steps": 10, "keep_last": 2, "storage_uri": "tenant://checkpoints/unit"},
}


def valid_manifest() -> dict:
    return copy.deepcopy(_BASE)


FIXTURE_MANIFESTS = Path(__file__).resolve().parents[1] / "data" / "fixtures" / "manifests"


def fixture_as_first_reviewed(name: str, folder: Path) -> Path:
    """The fixture manifest `name` as it was reviewed before it bound its decision's baseline
    (the same document without `decision_baseline`, as the generator writes JSON), written to
    `folder`: the bytes whose digest tests pin to show an older manifest still means what it meant."""
    document = json.loads((FIXTURE_MANIFESTS / name).read_text())
    del document["decision_baseline"]
    path = folder / name
    path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    return path


def write_file(path: Path, content: bytes | str, mode: int = 0o644) -> str:
    data = content.encode() if isinstance(content, str) else content
    path.write_bytes(data)
    os.chmod(path, mode)
    return str(path)


def write_manifest(path: Path, document: dict) -> str:
    return write_file(path, json.dumps(document, indent=2))



SUITE_LINES = (
    '{"id": "q1", "benchmark": "trivia", "question": "Which keyword defines a function in Python?", "answer": "def"}\n'
    '{"id": "q2", "benchmark": "arith", "question": "What is seven times six?", "answer": "42"}\n'
)

# A tiny real corpus: two near-duplicates, one document that quotes an eval item verbatim.
CORPUS_LINES = "".join(
    json.dumps({"id": f"n{i}", "text": text}) + "\n"
    for i, text in enumerate([
        "Generators produce values lazily, one at a time, and remember where they stopped between calls.",
        "Generators produce values lazily, one at a time, and remember where they stopped between the calls.",
        "A dictionary maps hashable keys to values and keeps the order in which the keys were inserted.",
        "Quiz night: Which keyword defines a function in Python? The answer was def, of course.",
        "List comprehensions build a new list from an iterable, optionally filtering its elements first.",
    ])
)

BASELINE_LINES = "".join(
    json.dumps({"id": f"b{i}", "text": f"Baseline note {i}: tuples are immutable sequences; sets hold unique items."}) + "\n"
    for i in range(8)
)
# A decision run small enough for unit tests (seconds); the fixtures use the asset's defaults.
# In this process: the decision's arms on the stage worker have tests of their own
# (tests/training/test_decision_defs.py, test_decision_on_worker.py, and `make run`'s).
QUICK_DECISION = {"num_steps": 2, "batch_size": 2, "sequence_length": 32, "vocab_size": 300,
                  "baseline_uris": ["dataroot://corpora/baseline.jsonl"], "num_threads": 1, "trainer": "in_process"}


class Installation:
    def __init__(self, root: Path):
        self.root = root
        self.data_root = root / "data"
        self.manifests_dir = self.data_root / "manifests"
        self.manifests_dir.mkdir(parents=True)
        suite = self.data_root / "evals" / "ito-fixture-evals-v1.jsonl"
        suite.parent.mkdir(parents=True)
        write_file(suite, SUITE_LINES)
        self.suite_digest = "sha256:" + hashlib.sha256(SUITE_LINES.encode()).hexdigest()
        corpus = self.data_root / "corpora" / "notes.jsonl"
        corpus.parent.mkdir(parents=True)
        write_file(corpus, CORPUS_LINES)
        self.corpus_sha256 = hashlib.sha256(CORPUS_LINES.encode()).hexdigest()
        write_file(corpus.parent / "baseline.jsonl", BASELINE_LINES)
        self.settings = Settings(
            project_root=root,
            state_dir=root / ".ito",
            data_root=self.data_root,
            manifests_dir=self.manifests_dir,
            eval_suite_path=suite,
        )

    def manifest(self, name: str, *, provenance: bool = True, **top_level) -> str:
        return write_manifest(self.manifests_dir / f"{name}.json", self.document(name, provenance=provenance, **top_level))

    def data_manifest(self, name: str) -> str:
        """A data manifest (kind "data") over the same corpus, in the same folder."""
        training = self.document(name)
        document = {"schema_version": 1, "kind": "data", "name": name, "data": training["data"]}
        return write_manifest(self.manifests_dir / f"{name}.json", document)

    def document(self, name: str, *, provenance: bool = True, **top_level) -> dict:
        document = valid_manifest()
        document["name"] = name
        document["data"][0]["decontamination"]["eval_suite_sha256"] = self.suite_digest
        document["data"][0]["uri"] = "dataroot://corpora/notes.jsonl"
        document["data"][0]["sha256"] = self.corpus_sha256
        # The quick decision below is too small to measure anything: its reviewers accept that.
        document["data_decision"] = {"accepted_verdicts": ["NO_GO", "WITHIN_NOISE", "INCONCLUSIVE"], "reason": "unit test",
                                     "reviewed_by": "tests"}
        if not provenance:
            del document["data"][0]["decontamination"]
        document.update(top_level)
        return document


POSTGRES_URL = os.environ.get("ITO_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")


def postgres_url_or_skip() -> str:
    """The test server's URL, or a visible skip where none is reachable (a laptop without one)."""
    import psycopg
    import pytest

    try:
        with psycopg.connect(POSTGRES_URL, connect_timeout=3):
            pass
    except psycopg.OperationalError:
        pytest.skip(f"no PostgreSQL reachable for the Postgres path (set ITO_TEST_POSTGRES_URL); tried {POSTGRES_URL.split('@')[-1]}")
    return POSTGRES_URL


def postgres_dagster_instance(home: Path, database: str, monkeypatch):
    """A Dagster instance from deploy/postgres/dagster.yaml on `database` of the test server."""
    import shutil

    import dagster as dg

    env = {"DAGSTER_PG_HOST": "127.0.0.1", "DAGSTER_PG_PORT": "5432", "DAGSTER_PG_USER": "postgres",
           "DAGSTER_PG_PASSWORD": "", "DAGSTER_PG_DB": database}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    home.mkdir()
    shutil.copy(Path(__file__).resolve().parents[1] / "deploy/postgres/dagster.yaml", home / "dagster.yaml")
    instance = dg.DagsterInstance.from_config(str(home))
    assert type(instance.run_storage).__name__ == "PostgresRunStorage"
    return instance


def examples(short: int, long: int) -> int:
    """How many examples a property test draws: `short` in `make test`, `long` in `make test-long`."""
    import os

    return long if os.environ.get("ITO_TEST_LONG") == "1" else short


@contextlib.contextmanager
def loopback_server(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """`handler` served on a free loopback port for the block -> its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


PAIR_FIXTURES = Path(__file__).resolve().parent.parent / "data" / "fixtures" / "posttraining"


def bound_pair_steps(data_root: Path, **sft_changes) -> list[dict]:
    """SFT and DPO recipe steps bound to the fixtures' pair files, copied under `data_root` (gate 5
    reads a recipe's pair files to plan its post-training)."""
    folder = data_root / "fixtures" / "posttraining"
    folder.mkdir(parents=True, exist_ok=True)
    steps = []
    for kind in ("sft", "dpo"):
        data = (PAIR_FIXTURES / f"{kind}_pairs.jsonl").read_bytes()
        (folder / f"{kind}_pairs.jsonl").write_bytes(data)
        steps.append({"kind": kind, "data": {"uri": f"dataroot://fixtures/posttraining/{kind}_pairs.jsonl",
                                             "sha256": hashlib.sha256(data).hexdigest(), "license": "CC0-1.0",
                                             "format": "jsonl"}})
    steps[0].update(sft_changes)
    return steps


class Stopped(Exception):
    """Raised by `spy_calls(..., stop=True)`: the code under test stopped where the spy stood."""


def spy_calls(monkeypatch, module, name: str, *, stop: bool = False) -> list:
    """Record each call's arguments to `module.name`, then make the call (or stop there, raising Stopped)."""
    calls, real = [], getattr(module, name)

    def spy(*args, **kwargs):
        calls.append((args, kwargs))
        if stop:
            raise Stopped(name)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, spy)
    return calls


def process_started_at(pid: int) -> float | None:
    """When process `pid` started (seconds since the epoch, to a clock tick), or None where there is
    none, or where `pid` is a thread's id (/proc answers for those too) or a zombie's. A pid is
    handed on once its process is gone (pid_max is 32768 here, and torch's threads take ids too, so
    a suite wraps them within minutes): a process that started after the one a test saw is another."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        stat = Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].split()
        boot = next(line for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime"))
    except (OSError, IndexError, StopIteration):
        return None
    tgid = next((line.split()[1] for line in status.splitlines() if line.startswith("Tgid:")), None)
    if tgid != str(pid) or stat[0] == "Z":
        return None
    return int(boot.split()[1]) + int(stat[19]) / os.sysconf("SC_CLK_TCK")


class ManifestSensorTicks:
    """The daemon's view of the reviewed-manifest sensor: one tick after another, each given the
    cursor the last one returned; each tick gives (its result, its log lines at `level` or above)."""

    SENSOR = "reviewed_manifest_sensor"

    def __init__(self, installation: "Installation", instance, caplog, *, level: int = 0):
        from definitions import build_definitions

        self.defs = build_definitions(installation.settings, domains=("manifest",))
        self.instance, self.caplog, self.level, self.cursor = instance, caplog, level, None

    def tick(self):
        import logging

        import dagster as dg

        context = dg.build_sensor_context(instance=self.instance, sensor_name=self.SENSOR, definitions=self.defs,
                                          resources=self.defs.resources, cursor=self.cursor)
        context._logger = logging.getLogger("sensor-under-test")  # what the daemon writes to the tick's log
        self.caplog.clear()
        with self.caplog.at_level("DEBUG", logger="sensor-under-test"):
            result = self.defs.resolve_sensor_def(self.SENSOR)(context)
        self.cursor = result.cursor
        return result, [r.getMessage() for r in self.caplog.records if r.levelno >= self.level]
