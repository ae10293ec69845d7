import hashlib
from datetime import UTC, datetime

import pytest

from core.lineage.hashing import environment, hash_frame
from core.lineage.queries import ATTRIBUTION, diff_lineage
from model_store.hashing import sha256_file, sha256_files
from relay.types import LineageId
from simulation.shop import ShopConfig, generate_events

A = LineageId(model="a" * 64, data="b" * 64, env="c" * 64, build="d" * 64)


def test_lineage_id_prints_four_12_hex_prefixes_and_parses_back():
    text = str(A)
    assert text == "aaaaaaaaaaaa_bbbbbbbbbbbb_cccccccccccc_dddddddddddd"
    parsed = LineageId.parse(text)
    assert diff_lineage(parsed, A).changed == []


@pytest.mark.parametrize("bad", ["", "abc", "a_b_c", "a_b_c_d_e", "zz_bb_cc_dd", "a__c_d"])
def test_malformed_lineage_id_is_rejected_with_the_expected_shape(bad):
    with pytest.raises(ValueError, match="four hex parts"):
        LineageId.parse(bad)


@pytest.mark.parametrize("part", ["model", "data", "env", "build"])
def test_diff_names_exactly_the_changed_part_and_its_cause(part):
    other = A.model_copy(update={part: "e" * 64})
    diff = diff_lineage(A, other)
    assert diff.changed == [part]
    assert diff.explain() == [f"{part} changed -> {ATTRIBUTION[part]}"]


def test_streaming_file_hash_matches_hashlib_for_sizes_around_the_block(tmp_path):
    for size in (0, 1, 4 * 1024 * 1024, 4 * 1024 * 1024 + 7):
        path = tmp_path / f"f{size}"
        data = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
        path.write_bytes(data)
        assert sha256_file(path, block=1024 * 1024) == (hashlib.sha256(data).hexdigest(), size)
    many = sha256_files(tmp_path.iterdir())
    assert all(sha256_file(p) == v for p, v in many.items())


def test_frame_hash_changes_when_one_value_changes():
    frame = generate_events(
        ShopConfig(seed=1, n_users=100, n_items=100), 500, datetime(2026, 1, 8, tzinfo=UTC)
    )
    before = hash_frame(frame)
    assert hash_frame(frame.copy()) == before
    frame.loc[10, "price"] += 1.0
    assert hash_frame(frame) != before


def test_environment_names_python_and_key_packages():
    env = environment()
    assert env["python"].startswith("3.11")
    assert env["packages"]["torch"].startswith("2.13")
    assert env["packages"]["onnxruntime"]
