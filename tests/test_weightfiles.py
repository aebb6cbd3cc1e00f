"""Safetensors files read in place: sharded indexes, pread into a buffer, zero-copy views, clear errors."""
from __future__ import annotations

import json
import struct

import pytest
import torch
from safetensors.torch import save_file

from memory.weightfiles import WeightFileError, WeightFiles


def _tensors(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"a.weight": torch.randn(64, 48, generator=g).to(torch.bfloat16),
            "a.bias": torch.randn(3, generator=g).to(torch.bfloat16),             # odd byte count: 6
            "b.weight": torch.randn(17, 5, generator=g),                           # fp32 after 6 bytes of bf16
            "c.steps": torch.arange(7, dtype=torch.int64)}


def _save_sharded(folder, tensors):
    folder.mkdir(parents=True, exist_ok=True)
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[:2], "model-00002-of-00002.safetensors": names[2:]}
    for file, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(folder / file))
    index = {"metadata": {}, "weight_map": {k: f for f, keys in shards.items() for k in keys}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


def test_sharded_index_reads_and_views_every_tensor(tmp_path):
    tensors = _tensors()
    _save_sharded(tmp_path / "m", tensors)
    files = WeightFiles.open(tmp_path / "m")
    assert len(files.files) == 2 and set(files.tensors) == set(tensors)
    assert files.nbytes == sum(t.numel() * t.element_size() for t in tensors.values())
    for name, t in tensors.items():
        src = files.tensors[name]
        assert src.dtype == t.dtype and src.shape == tuple(t.shape)
        assert torch.equal(src.file.view(src), t)                                   # zero-copy (or aligned copy)
        buf = torch.empty(src.nbytes, dtype=torch.uint8)
        src.file.read_into(buf, src.offset)
        assert torch.equal(buf.view(t.dtype).view(t.shape), t)
        src.file.drop(src.offset, src.nbytes, cache=True)                          # give the pages back: no error
        assert torch.equal(src.file.view(src), t)                                   # and read again on demand


def test_views_share_the_mapped_file(tmp_path):
    save_file({"w": torch.arange(4096, dtype=torch.float32)}, str(tmp_path / "model.safetensors"))
    files = WeightFiles.open(tmp_path)
    src = files.tensors["w"]
    v1, v2 = src.file.view(src), src.file.view(src)
    assert v1.data_ptr() == v2.data_ptr()                                           # the same mapped pages


def test_damaged_files_say_what_is_wrong(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "model.safetensors").write_bytes(b"\x10\x00")
    with pytest.raises(WeightFileError, match="too short"):
        WeightFiles.open(tmp_path / "a")
    (tmp_path / "b").mkdir()
    save_file({"w": torch.zeros(1000)}, str(tmp_path / "b" / "model.safetensors"))
    data = (tmp_path / "b" / "model.safetensors").read_bytes()
    (tmp_path / "b" / "model.safetensors").write_bytes(data[:-100])                # an interrupted download
    with pytest.raises(WeightFileError, match="truncated"):
        WeightFiles.open(tmp_path / "b")
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "model.safetensors").write_bytes(struct.pack("<Q", 5) + b"{oops" + b"\0" * 8)
    with pytest.raises(WeightFileError, match="damaged"):
        WeightFiles.open(tmp_path / "c")
    _save_sharded(tmp_path / "d", _tensors())
    (tmp_path / "d" / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(WeightFileError, match="model-00002-of-00002.safetensors, which is missing"):
        WeightFiles.open(tmp_path / "d")
    (tmp_path / "e").mkdir()
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors"):
        WeightFiles.open(tmp_path / "e")
