"""The store on disk: increasing versions, pruning, delta fallback, and reopening."""

from __future__ import annotations

import pytest
import torch

from rollflow.runtime.weights import UnknownVersionError, WeightsError, WeightStore, state_digest
from tests.runtime.weights.factories import assert_same_state, tiny_llama


def test_versions_must_increase(tmp_path):
    store = WeightStore(tmp_path)
    store.publish(3, tiny_llama(0))
    for bad in (3, 2, -1, 10**8):  # 10**8 would be stored but never listed (8-digit folders)
        with pytest.raises(WeightsError, match="versions are integers that increase"):
            store.publish(bad, tiny_llama(1))
    assert store.versions().versions == (3,)


def test_a_version_the_folder_layout_cannot_list_is_refused(tmp_path):
    """Version 100000000 was once accepted, then never listed nor served."""
    store = WeightStore(tmp_path)
    with pytest.raises(WeightsError, match=r"within 0\.\.99999999"):
        store.publish(10**8, tiny_llama(0))
    store.publish(10**8 - 1, tiny_llama(0))
    assert store.versions().versions == (10**8 - 1,)


def test_publish_returns_the_default_codec_manifest_of_the_exact_tensors(tmp_path):
    state = tiny_llama(0)
    manifest = WeightStore(tmp_path, default_codec="zstd").publish(1, state, files={"config.json": "{}"})
    assert (manifest.version, manifest.codec, manifest.base_version) == (1, "zstd", None)
    assert manifest.state_digest == state_digest(state)
    assert manifest.files == {"config.json": "{}"}
    assert 0 < manifest.wire_nbytes < manifest.model_nbytes


def test_old_versions_and_their_payloads_are_pruned(tmp_path):
    store = WeightStore(tmp_path, keep_versions=2)
    for version in range(1, 4):
        store.publish(version, tiny_llama(version))
        if version > 1:
            store.manifest(version, "delta+zstd", base_version=version - 1)
    assert store.versions().versions == (2, 3)
    payloads = sorted(p.name for p in (tmp_path / "payloads").iterdir())
    assert payloads == ["v2-zstd", "v3-delta-zstd-from2", "v3-zstd"]
    with pytest.raises(UnknownVersionError, match="not in the store"):
        store.manifest(1)


def test_a_delta_from_a_missing_base_falls_back_to_the_full_payload(tmp_path):
    store = WeightStore(tmp_path, keep_versions=1)
    store.publish(1, tiny_llama(1))
    store.publish(2, tiny_llama(2))
    manifest = store.manifest(2, "delta+zstd", base_version=1)
    assert manifest.base_version is None and manifest.codec == "zstd"
    assert "base version 1 is not in the store" in manifest.fallback_reason
    assert "no base version" in store.manifest(2, "delta", base_version=None).fallback_reason


def test_a_reopened_store_serves_what_an_earlier_process_published(tmp_path):
    state = tiny_llama(0)
    WeightStore(tmp_path).publish(5, state)
    reopened = WeightStore(tmp_path)
    assert reopened.versions().latest == 5
    assert_same_state(reopened.load(5), {**state, "lm_head.weight": state["lm_head.weight"].clone()})
    assert reopened.manifest().version == 5


def test_bad_published_files_and_tensors_are_refused(tmp_path):
    store = WeightStore(tmp_path)
    with pytest.raises(WeightsError, match="plain file name"):
        store.publish(1, tiny_llama(0), files={"../escape.json": "{}"})
    with pytest.raises(WeightsError, match="not a tensor"):
        store.publish(1, {"w": [1.0, 2.0]})
    with pytest.raises(WeightsError, match="unsupported tensor dtype"):
        store.publish(1, {"w": torch.zeros(2, dtype=torch.complex64)})
    assert store.versions().versions == ()
