"""Digests streamed while DCP writes, and verification split among threads and ranks: a streamed
digest is the file's digest, any flipped byte of any file is caught with one rank and with two
(both ranks giving the same answer), a marker written before the algorithm was named still
verifies, and the digests travel without any file of their own in the checkpoint."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from ito_assets.digests import file_sha256
from ito_assets.runtime.checkpoint import markers, resume
from ito_assets.runtime.checkpoint.digest_writer import DigestingWriter
from ito_assets.runtime.checkpoint.file_digest import ALGORITHMS, FILE_DIGEST, FileDigest, file_digest
from ito_assets.runtime.checkpoint.markers import MARKER_NAME, METADATA_NAME
from ito_assets.runtime.checkpoint.saver import CheckpointConfig, Checkpointer

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

STEP = 5
TWO_RANK_FILES = [METADATA_NAME, "__0_0.distcp", "__1_0.distcp"]


def _state(rank: int = 0) -> dict:
    # A key of each rank's own: DCP saves a replicated tensor once, which would leave a shard empty.
    return {"model": {f"w{rank}": torch.arange(64 * 64, dtype=torch.float32).reshape(64, 64) + rank},
            "train": {"step": torch.tensor(STEP)}}


def _save(stage_dir: Path, rank: int = 0) -> Path:
    saver = Checkpointer(CheckpointConfig(directory=stage_dir, interval_steps=STEP, keep_last=2),
                         process_group=None, rank=rank)
    saver.save(STEP, _state(rank))
    saver.close()
    return markers.checkpoint_dir(stage_dir, STEP)


def _flip(path: Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 0x01
    path.write_bytes(bytes(data))


# --- the writer --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
@pytest.mark.parametrize("thread_count", [1, 3])
def test_every_streamed_digest_equals_the_digest_of_the_file_read_back(tmp_path, algorithm, thread_count):
    state = {"a": torch.randn(300, 300), "b": torch.arange(1000), "c": {"d": torch.ones(7)}, "step": 3}
    writer = DigestingWriter(tmp_path, algorithm=algorithm, thread_count=thread_count)
    dcp.save(state, storage_writer=writer, no_dist=True)
    shards = sorted(p.name for p in tmp_path.glob("*.distcp"))
    assert [d.name for d in writer.file_digests] == shards and len(shards) == thread_count
    for written in writer.file_digests:
        path = tmp_path / written.name
        assert written == FileDigest(path.name, path.stat().st_size, file_digest(path, algorithm))


def test_the_hashing_writer_leaves_the_plain_writers_checkpoint(tmp_path):
    state = {"a": torch.randn(50, 50), "step": 3}
    dcp.save(state, storage_writer=dcp.FileSystemWriter(tmp_path / "plain"), no_dist=True)
    dcp.save(state, storage_writer=DigestingWriter(tmp_path / "hashed"), no_dist=True)
    plain, hashed = (dcp.FileSystemReader(str(tmp_path / k)).read_metadata() for k in ("plain", "hashed"))
    assert plain.storage_data == hashed.storage_data  # no digest entry reached .metadata
    assert (tmp_path / "plain" / "__0_0.distcp").read_bytes() == (tmp_path / "hashed" / "__0_0.distcp").read_bytes()
    loaded = {"a": torch.zeros(50, 50), "step": 0}
    dcp.load(loaded, checkpoint_id=str(tmp_path / "hashed"), no_dist=True)
    assert torch.equal(loaded["a"], state["a"]) and loaded["step"] == 3


def test_a_save_reads_back_only_the_metadata_and_leaves_no_sidecar(tmp_path, monkeypatch):
    read_back = []
    real = markers.file_digest
    monkeypatch.setattr(markers, "file_digest", lambda path, algorithm: read_back.append(path.name) or real(path, algorithm))
    folder = _save(tmp_path)
    assert read_back == [METADATA_NAME]
    assert sorted(p.name for p in folder.iterdir()) == sorted([METADATA_NAME, "__0_0.distcp", MARKER_NAME])
    marker = markers.read_marker(folder)
    assert marker.algorithm == FILE_DIGEST and [f[0] for f in marker.files] == [METADATA_NAME, "__0_0.distcp"]
    assert marker.metadata_sha256 == file_sha256(folder / METADATA_NAME)
    assert marker.manifest_sha256 == markers.manifest_sha256(marker.files)
    assert markers.validate(folder) is None


def test_a_streamed_size_that_differs_from_the_file_gets_no_marker(tmp_path):
    folder = tmp_path / "step-000000005"
    folder.mkdir()
    (folder / METADATA_NAME).write_bytes(b"m")
    (folder / "__0_0.distcp").write_bytes(b"shard")
    with pytest.raises(RuntimeError, match="holds 5 bytes but its writer wrote 6"):
        markers.write_marker(folder, STEP, streamed=[FileDigest("__0_0.distcp", 6, "0" * 32)])
    with pytest.raises(RuntimeError, match="written but not in the folder: __1_0.distcp"):
        markers.write_marker(folder, STEP, streamed=[FileDigest("__1_0.distcp", 1, "0" * 32)])
    assert not (folder / MARKER_NAME).exists()


# --- one rank ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [METADATA_NAME, "__0_0.distcp"])
@pytest.mark.parametrize("position", [0, -1])
@pytest.mark.parametrize("threads", [1, 4])
def test_one_flipped_byte_in_any_file_is_caught_with_one_rank(tmp_path, name, position, threads):
    folder = _save(tmp_path)
    _flip(folder / name, position)
    assert markers.validate(folder, threads=threads) == f"digest mismatch in {name}"
    assert resume.verify(folder, rank=0, group=None) == f"digest mismatch in {name}"


def _old_marker(folder: Path) -> None:
    """The marker as it was written before the algorithm was named: sha256 digests, no manifest."""
    files = [[p.name, p.stat().st_size, file_sha256(p)] for p in sorted(folder.iterdir()) if p.name != MARKER_NAME]
    body = {"step": STEP, "metadata_sha256": file_sha256(folder / METADATA_NAME), "files": files}
    (folder / MARKER_NAME).write_text(json.dumps(body, sort_keys=True))


def test_a_marker_written_before_the_algorithm_was_named_still_validates_and_loads(tmp_path):
    folder = _save(tmp_path)
    _old_marker(folder)
    marker = markers.read_marker(folder)
    assert marker.algorithm == "sha256" and marker.manifest_sha256 is None
    assert markers.validate(folder) is None
    state = {"model": {"w0": torch.zeros(64, 64)}, "train": {"step": torch.tensor(0)}}
    assert resume.load_latest(tmp_path, state, rank=0, group=None).step == STEP
    assert torch.equal(state["model"]["w0"], _state()["model"]["w0"])
    _flip(folder / "__0_0.distcp", 10)
    assert markers.validate(folder) == "digest mismatch in __0_0.distcp"


@pytest.mark.parametrize("change", ["missing", "extra"])
def test_a_missing_or_extra_file_is_refused(tmp_path, change):
    folder = _save(tmp_path)
    if change == "missing":
        (folder / "__0_0.distcp").unlink()
    else:
        (folder / "__1_0.distcp").write_bytes(b"")
    assert markers.validate(folder) == "files differ from the marker's list"


def test_an_unknown_algorithm_or_a_file_list_that_does_not_match_its_manifest_is_refused(tmp_path, monkeypatch):
    folder = _save(tmp_path)
    body = json.loads((folder / MARKER_NAME).read_text())
    monkeypatch.setattr(markers, "file_digest", lambda *args: pytest.fail("hashed a refused checkpoint"))
    (folder / MARKER_NAME).write_text(json.dumps({**body, "file_digest": "crc32"}))
    assert markers.validate(folder) == "the marker's file digest 'crc32' is not known here"
    files = body["files"]
    files[1][2] = "0" * 32  # a digest changed without its manifest
    (folder / MARKER_NAME).write_text(json.dumps({**body, "files": files}))
    assert markers.validate(folder) == "the marker's file list does not match its manifest digest"


def test_the_shares_are_disjoint_cover_every_file_and_balance_the_bytes():
    sizes = [100, 1, 90, 50, 50, 2, 0]
    marker = markers.Marker(step=1, metadata_sha256="", files=tuple((f"f{i}", s, "") for i, s in enumerate(sizes)))
    split = markers.shares(marker, 3)
    assert sorted(i for share in split for i in share) == list(range(len(sizes)))
    assert split == [[0], [1, 2, 5, 6], [3, 4]] and split == markers.shares(marker, 3)  # 100, 93, 100 bytes
    assert markers.shares(marker, 1) == [list(range(len(sizes)))]
    assert markers.shares(marker, 9)[7:] == [[], []]


# --- two ranks (gloo) ----------------------------------------------------------------------------------------


def _two_rank_session(rank: int, store: str, stage_dir: str, out: str) -> None:
    """Save with two ranks, then for each file and position: rank 0 flips a byte, both verify,
    rank 0 restores it. Each rank records its answers and the files it hashed."""
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    hashed: list[str] = []
    real = markers.file_digest
    markers.file_digest = lambda path, algorithm: hashed.append(path.name) or real(path, algorithm)
    stage = Path(stage_dir)
    folder = _save(stage, rank)
    answers = {"clean": resume.verify(folder, rank=rank, group=None), "hashed_clean": sorted(hashed)}
    for name in TWO_RANK_FILES:
        for position in (0, -1):
            original = (folder / name).read_bytes()
            if rank == 0:
                _flip(folder / name, position)
            dist.barrier()
            answers[f"{name}@{position}"] = resume.verify(folder, rank=rank, group=None)
            dist.barrier()
            if rank == 0:
                (folder / name).write_bytes(original)
    for change in ("missing", "extra"):
        if rank == 0:
            (folder / "__1_0.distcp").rename(stage / "aside") if change == "missing" else (folder / "__2_0.distcp").write_bytes(b"")
        dist.barrier()
        answers[change] = resume.verify(folder, rank=rank, group=None)
        dist.barrier()
        if rank == 0:
            (stage / "aside").rename(folder / "__1_0.distcp") if change == "missing" else (folder / "__2_0.distcp").unlink()
    if rank == 0:
        _old_marker(folder)
    dist.barrier()
    answers["old_marker"] = resume.verify(folder, rank=rank, group=None)
    answers["files"] = sorted(p.name for p in folder.iterdir())
    Path(out, f"rank{rank}.json").write_text(json.dumps(answers))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> list[dict]:
    root = tmp_path_factory.mktemp("two-ranks")
    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=_two_rank_session, args=(rank, str(root / "store"), str(root / "stage"), str(root)))
                 for rank in range(2)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=240)
    assert [p.exitcode for p in processes] == [0, 0]
    return [json.loads((root / f"rank{rank}.json").read_text()) for rank in range(2)]


def test_two_ranks_verify_a_whole_checkpoint_each_hashing_its_own_share(two_ranks):
    assert [answers["clean"] for answers in two_ranks] == [None, None]
    shares = [set(answers["hashed_clean"]) - {METADATA_NAME} for answers in two_ranks]  # rank 0 hashed .metadata at save
    assert shares[0].isdisjoint(shares[1]) and shares[0] | shares[1] == {"__0_0.distcp", "__1_0.distcp"}
    assert two_ranks[0]["files"] == sorted(TWO_RANK_FILES + [MARKER_NAME])  # no sidecar left


@pytest.mark.parametrize("name", TWO_RANK_FILES)
@pytest.mark.parametrize("position", [0, -1])
def test_one_flipped_byte_in_any_file_is_caught_by_both_ranks_alike(two_ranks, name, position):
    assert [answers[f"{name}@{position}"] for answers in two_ranks] == [f"digest mismatch in {name}"] * 2


@pytest.mark.parametrize("change", ["missing", "extra"])
def test_a_missing_or_extra_file_is_refused_by_both_ranks(two_ranks, change):
    assert [answers[change] for answers in two_ranks] == ["files differ from the marker's list"] * 2


def test_a_marker_written_before_the_algorithm_was_named_verifies_on_two_ranks(two_ranks):
    assert [answers["old_marker"] for answers in two_ranks] == [None, None]
