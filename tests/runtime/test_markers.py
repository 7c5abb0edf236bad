"""Completion markers at their boundaries: every way a checkpoint folder differs from its marker
is refused, with its own reason, and refused before any file is trusted (or even hashed, where the
marker's list or a size already tells)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from ito_assets import digests
from ito_assets.runtime.checkpoint import markers
from ito_assets.runtime.checkpoint.file_digest import FILE_DIGEST, new_hasher
from ito_assets.runtime.checkpoint.markers import MARKER_NAME, METADATA_NAME, Marker

STEP = 16
SHARDS = {"__0_0.distcp": b"rank zero shard bytes" * 7, "__1_0.distcp": b"rank one" * 3}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _digest(data: bytes) -> str:
    """A payload file's digest under the algorithm new markers use."""
    hasher = new_hasher(FILE_DIGEST)
    hasher.update(data)
    return hasher.hexdigest()


def _save(stage_dir: Path, step: int = STEP, *, metadata: bytes = b"dcp metadata", shards=None) -> Path:
    """A finished DCP save of `step` with its marker."""
    folder = markers.checkpoint_dir(stage_dir, step)
    folder.mkdir(parents=True)
    (folder / METADATA_NAME).write_bytes(metadata)
    for name, data in (SHARDS if shards is None else shards).items():
        (folder / name).write_bytes(data)
    markers.write_marker(folder, step)
    return folder


def _body(folder: Path) -> dict:
    return json.loads((folder / MARKER_NAME).read_text())


def _rewrite_marker(folder: Path, **changes) -> None:
    """Changed files come with their manifest digest recomputed, so that the check under test is
    the one that refuses them."""
    if "files" in changes and "manifest_sha256" not in changes:
        changes["manifest_sha256"] = markers.manifest_sha256(changes["files"])
    (folder / MARKER_NAME).write_text(json.dumps({**_body(folder), **changes}))


@pytest.fixture
def no_hashing(monkeypatch):
    """Call it once the folder is set up: from then on any hashing fails the test (the refusal
    must come before any digest is computed)."""
    def arm(*names: str) -> None:
        """`names`: only these files may not be hashed (those a size check already refuses)."""
        real = markers.file_digest

        def refuse(path, algorithm):
            if names and path.name not in names:
                return real(path, algorithm)
            raise AssertionError(f"hashed {path.name} although it was already refused")
        monkeypatch.setattr(markers, "file_digest", refuse)
    return arm


# --- names and steps ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("step", "name"), [(0, "step-000000000"), (1, "step-000000001"), (16, "step-000000016"),
                                            (999_999_999, "step-999999999")])
def test_checkpoint_dir_and_step_of_round_trip_at_the_edges(tmp_path, step, name):
    folder = markers.checkpoint_dir(tmp_path, step)
    assert folder == tmp_path / name
    assert markers.step_of(folder) == step


@pytest.mark.parametrize("name", [
    "step-00000001",  # eight digits
    "step-0000000001",  # ten digits
    "step-1000000000",  # ten digits: one past the largest nine-digit step
    "step--00000001",  # what checkpoint_dir makes of step -1
    "step-00000001a",
    "step-0000000 1",
    "xstep-000000001",
    "step-000000001x",
    "step-000000001-old",
    "Step-000000001",
    "step_000000001",
    "step-",
    "",
    "discarded-step-000000016-spk_0123456789abcdef",
    "step-000000001\n",            # a trailing newline is part of the name
    "step-\u0661\u0662\u0663\u0664\u0665\u0666\u0667\u0668\u0669",  # Arabic-Indic digits
])
def test_step_of_refuses_every_other_name(name):
    assert markers.step_of(Path("/stage") / name) is None


def test_step_of_reads_only_the_last_path_component():
    assert markers.step_of(Path("/stage/step-000000008/step-000000024")) == 24
    assert markers.step_of(Path("/step-000000008/shard")) is None


# --- hashing and writing -----------------------------------------------------------------------------------


def test_markers_hash_files_with_the_one_file_digest(tmp_path):
    # Across block sizes: tests/test_digests.py.
    path = tmp_path / "blob"
    path.write_bytes(b"checkpoint bytes")
    assert markers.file_sha256 is digests.file_sha256
    assert markers.file_sha256(path) == _sha(b"checkpoint bytes")


def test_write_marker_lists_every_payload_file_sorted_with_size_and_digest(tmp_path):
    folder = _save(tmp_path)
    body = _body(folder)
    expected = sorted([(METADATA_NAME, len(b"dcp metadata"), _digest(b"dcp metadata"))]
                      + [(name, len(data), _digest(data)) for name, data in SHARDS.items()])
    manifest = hashlib.sha256(json.dumps([list(f) for f in expected], separators=(",", ":")).encode()).hexdigest()
    assert body == {"step": STEP, "metadata_sha256": _sha(b"dcp metadata"), "files": [list(f) for f in expected],
                    "file_digest": FILE_DIGEST, "manifest_sha256": manifest}
    marker = markers.read_marker(folder)
    assert marker == Marker(step=STEP, metadata_sha256=_sha(b"dcp metadata"), files=tuple(expected),
                            algorithm=FILE_DIGEST, manifest_sha256=manifest)
    assert marker.num_bytes == len(b"dcp metadata") + sum(len(d) for d in SHARDS.values())
    assert markers.validate(folder) is None


def test_the_marker_is_written_with_sorted_keys(tmp_path):
    # Canonical bytes: the same save always gives the same marker file.
    folder = _save(tmp_path)
    text = (folder / MARKER_NAME).read_text()
    assert list(json.loads(text)) == ["file_digest", "files", "manifest_sha256", "metadata_sha256", "step"]
    assert text == json.dumps(_body(folder), sort_keys=True)


def test_write_marker_returns_what_it_wrote(tmp_path):
    folder = markers.checkpoint_dir(tmp_path, 3)
    folder.mkdir()
    (folder / METADATA_NAME).write_bytes(b"m")
    assert markers.write_marker(folder, 3) == markers.read_marker(folder)


def test_write_marker_skips_temporaries_the_marker_itself_and_folders(tmp_path):
    folder = markers.checkpoint_dir(tmp_path, STEP)
    folder.mkdir()
    (folder / METADATA_NAME).write_bytes(b"m")
    (folder / ".tmp-partial").write_bytes(b"half a write")
    (folder / "nested").mkdir()
    (folder / MARKER_NAME).write_text("an old marker")
    marker = markers.write_marker(folder, STEP)
    assert [name for name, _, _ in marker.files] == [METADATA_NAME]
    assert markers.validate(folder) is None  # the temporary is neither listed nor a mismatch


def test_a_save_without_metadata_gets_no_marker(tmp_path):
    folder = markers.checkpoint_dir(tmp_path, STEP)
    folder.mkdir()
    (folder / "__0_0.distcp").write_bytes(b"shard")
    with pytest.raises(RuntimeError, match=r"^a finished DCP save has a \.metadata file; this folder has none$"):
        markers.write_marker(folder, STEP)
    assert not (folder / MARKER_NAME).exists()
    assert markers.validate(folder) == "no completion marker (partial save)"


def test_the_metadata_digest_is_the_metadata_files_and_not_another(tmp_path):
    folder = _save(tmp_path, metadata=b"the real metadata")
    assert markers.read_marker(folder).metadata_sha256 == _sha(b"the real metadata")


def test_an_empty_payload_file_is_listed_with_size_zero(tmp_path):
    folder = _save(tmp_path, shards={"__0_0.distcp": b""})
    assert ("__0_0.distcp", 0, _digest(b"")) in markers.read_marker(folder).files
    assert markers.validate(folder) is None


# --- reading a marker ------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", [
    "",
    "{",
    "[]",
    "null",
    "{}",
    '{"step": 16, "metadata_sha256": "x"}',  # no files
    '{"step": 16, "files": []}',  # no metadata digest
    '{"metadata_sha256": "x", "files": []}',  # no step
    '{"step": "sixteen", "metadata_sha256": "x", "files": []}',
    '{"step": 16, "metadata_sha256": "x", "files": [["a", 1]]}',  # a short entry
    '{"step": 16, "metadata_sha256": "x", "files": [["a", 1, "d", "extra"]]}',
    '{"step": 16, "metadata_sha256": "x", "files": [["a", "big", "d"]]}',
    '{"step": 16, "metadata_sha256": "x", "files": 5}',
])
def test_an_unreadable_marker_reads_as_none_and_refuses_the_folder(tmp_path, text, no_hashing):
    folder = _save(tmp_path)
    (folder / MARKER_NAME).write_text(text)
    no_hashing()
    assert markers.read_marker(folder) is None
    assert markers.validate(folder) == "no completion marker (partial save)"


def test_a_marker_that_is_not_utf8_reads_as_none(tmp_path):
    folder = _save(tmp_path)
    (folder / MARKER_NAME).write_bytes(b"\xff\xfe\x00")
    assert markers.read_marker(folder) is None


def test_a_missing_marker_or_folder_reads_as_none(tmp_path):
    assert markers.read_marker(tmp_path / "nowhere") is None
    folder = _save(tmp_path)
    (folder / MARKER_NAME).unlink()
    assert markers.read_marker(folder) is None


def test_read_marker_converts_the_json_types(tmp_path):
    folder = _save(tmp_path, shards={})
    (folder / MARKER_NAME).write_text(json.dumps({"step": "16", "metadata_sha256": 7, "files": [[5, "3", 9]]}))
    assert markers.read_marker(folder) == Marker(step=16, metadata_sha256="7", files=(("5", 3, "9"),))


# --- validate: each refusal at its boundary ----------------------------------------------------------------


def test_a_whole_checkpoint_validates(tmp_path):
    assert markers.validate(_save(tmp_path)) is None


def test_a_partial_save_without_marker_is_refused_before_any_hashing(tmp_path, no_hashing):
    folder = markers.checkpoint_dir(tmp_path, STEP)
    folder.mkdir()
    (folder / METADATA_NAME).write_bytes(b"m")
    no_hashing()
    assert markers.validate(folder) == "no completion marker (partial save)"


@pytest.mark.parametrize("marker_step", [STEP - 1, STEP + 1, 0])
def test_a_marker_naming_another_step_is_refused_before_any_hashing(tmp_path, marker_step, no_hashing):
    folder = _save(tmp_path)
    _rewrite_marker(folder, step=marker_step)
    no_hashing()
    assert markers.validate(folder) == "the marker names another step"


def test_a_marker_in_a_folder_without_a_step_name_is_refused(tmp_path):
    folder = _save(tmp_path)
    renamed = folder.rename(tmp_path / "discarded-step-000000016-spk_0123456789abcdef")
    assert markers.validate(renamed) == "the marker names another step"


def test_an_extra_file_is_refused_before_any_hashing(tmp_path, no_hashing):
    folder = _save(tmp_path)
    (folder / "__2_0.distcp").write_bytes(b"")  # even an empty one
    no_hashing()
    assert markers.validate(folder) == "files differ from the marker's list"


def test_a_missing_file_is_refused_before_any_hashing(tmp_path, no_hashing):
    folder = _save(tmp_path)
    (folder / "__1_0.distcp").unlink()
    no_hashing()
    assert markers.validate(folder) == "files differ from the marker's list"


def test_a_missing_metadata_file_is_refused(tmp_path, no_hashing):
    folder = _save(tmp_path)
    (folder / METADATA_NAME).unlink()
    no_hashing()
    assert markers.validate(folder) == "files differ from the marker's list"


def test_a_renamed_file_is_refused(tmp_path, no_hashing):
    folder = _save(tmp_path)
    (folder / "__1_0.distcp").rename(folder / "__3_0.distcp")
    no_hashing()
    assert markers.validate(folder) == "files differ from the marker's list"


def test_a_marker_listing_a_file_twice_still_checks_every_entry(tmp_path):
    folder = _save(tmp_path)
    files = _body(folder)["files"]
    _rewrite_marker(folder, files=files + [files[0]])
    assert markers.validate(folder) is None  # the same names, every listed digest matches


@pytest.mark.parametrize("cut", [1, 10])
def test_a_truncated_file_is_refused_on_its_size_before_hashing(tmp_path, cut, no_hashing):
    folder = _save(tmp_path)
    path = folder / "__0_0.distcp"
    path.write_bytes(SHARDS["__0_0.distcp"][:-cut])
    no_hashing("__0_0.distcp")
    assert markers.validate(folder) == "digest mismatch in __0_0.distcp"


def test_a_file_emptied_is_refused(tmp_path, no_hashing):
    folder = _save(tmp_path)
    (folder / "__1_0.distcp").write_bytes(b"")
    no_hashing("__1_0.distcp")
    assert markers.validate(folder) == "digest mismatch in __1_0.distcp"


def test_a_file_grown_by_one_byte_is_refused(tmp_path, no_hashing):
    folder = _save(tmp_path)
    (folder / "__1_0.distcp").write_bytes(SHARDS["__1_0.distcp"] + b"\0")
    no_hashing("__1_0.distcp")
    assert markers.validate(folder) == "digest mismatch in __1_0.distcp"


@pytest.mark.parametrize("position", [0, -1])
def test_one_flipped_byte_of_the_same_size_is_refused_on_its_digest(tmp_path, position):
    folder = _save(tmp_path)
    path = folder / "__1_0.distcp"
    data = bytearray(SHARDS["__1_0.distcp"])
    data[position] ^= 0x01
    path.write_bytes(bytes(data))
    assert markers.validate(folder) == "digest mismatch in __1_0.distcp"


def test_a_changed_metadata_file_is_refused(tmp_path):
    folder = _save(tmp_path, metadata=b"dcp metadata")
    (folder / METADATA_NAME).write_bytes(b"dcp metadatA")
    assert markers.validate(folder) == f"digest mismatch in {METADATA_NAME}"


def test_a_marker_whose_listed_digest_does_not_match_is_refused(tmp_path):
    folder = _save(tmp_path)
    files = _body(folder)["files"]
    files[-1][2] = "0" * 64
    _rewrite_marker(folder, files=files)
    assert markers.validate(folder) == f"digest mismatch in {files[-1][0]}"


def test_a_marker_whose_listed_size_does_not_match_is_refused_before_hashing(tmp_path, no_hashing):
    folder = _save(tmp_path)
    files = _body(folder)["files"]
    files[0][1] += 1
    _rewrite_marker(folder, files=files)
    no_hashing(files[0][0])
    assert markers.validate(folder) == f"digest mismatch in {files[0][0]}"


def test_the_first_mismatching_file_in_the_markers_order_is_named(tmp_path):
    folder = _save(tmp_path)
    for name in SHARDS:
        (folder / name).write_bytes(b"X" * len(SHARDS[name]))
    assert markers.validate(folder) == f"digest mismatch in {sorted(SHARDS)[0]}"


def test_validate_hashes_every_listed_file_of_a_whole_checkpoint(tmp_path, monkeypatch):
    folder = _save(tmp_path)
    hashed = []
    real = markers.file_digest
    monkeypatch.setattr(markers, "file_digest", lambda path, algorithm: hashed.append(path.name) or real(path, algorithm))
    assert markers.validate(folder) is None
    assert sorted(hashed) == sorted([METADATA_NAME, *SHARDS])


def test_the_checks_run_in_order_marker_step_list_digest(tmp_path, no_hashing):
    # Several things wrong at once: the earliest check names the reason.
    folder = _save(tmp_path)
    (folder / "__0_0.distcp").write_bytes(b"")
    (folder / "__9_9.distcp").write_bytes(b"")
    no_hashing()
    assert markers.validate(folder) == "files differ from the marker's list"
    _rewrite_marker(folder, step=STEP + 8)
    assert markers.validate(folder) == "the marker names another step"
    (folder / MARKER_NAME).write_text("{")
    assert markers.validate(folder) == "no completion marker (partial save)"


# --- candidates ------------------------------------------------------------------------------------------


def test_candidates_are_the_step_folders_newest_first(tmp_path):
    for step in (8, 24, 16, 0):
        markers.checkpoint_dir(tmp_path, step).mkdir()
    (tmp_path / "step-000000032").write_text("a file, not a folder")
    (tmp_path / "discarded-step-000000040-spk_0123456789abcdef").mkdir()
    (tmp_path / "step-40").mkdir()
    (tmp_path / "proposals").mkdir()
    assert [markers.step_of(p) for p in markers.candidates(tmp_path)] == [24, 16, 8, 0]
    assert markers.candidates(tmp_path)[0] == markers.checkpoint_dir(tmp_path, 24)


def test_candidates_include_folders_without_a_marker(tmp_path):
    # Listing is not trusting: validate decides, candidates only orders.
    markers.checkpoint_dir(tmp_path, 8).mkdir()
    assert markers.candidates(tmp_path) == [markers.checkpoint_dir(tmp_path, 8)]


def test_candidates_of_a_missing_or_empty_stage_are_empty(tmp_path):
    assert markers.candidates(tmp_path / "missing") == []
    assert markers.candidates(tmp_path) == []
    (tmp_path / "a-file").write_text("")
    assert markers.candidates(tmp_path / "a-file") == []


def test_a_writers_temporary_sibling_is_not_a_payload_file_but_a_dotted_payload_is(tmp_path):
    """write_atomic leaves `.NAME.PID.tmp` behind only if killed mid-write: such a leftover is
    neither listed in the marker nor an 'extra file'; DCP's own `.metadata` is payload."""
    folder = _save(tmp_path)
    (folder / ".COMPLETE.json.4242.tmp").write_bytes(b"half a marker")
    assert markers.validate(folder) is None
    names = [entry[0] for entry in _body(folder)["files"]]
    assert METADATA_NAME in names and not any(name.endswith(".tmp") for name in names)
    (folder / "shard.tmp").write_bytes(b"not a temporary sibling")  # no leading dot: a real file
    assert markers.validate(folder) is not None
