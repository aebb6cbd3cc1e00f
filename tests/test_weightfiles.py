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


def test_a_large_read_is_cut_into_page_aligned_pieces_for_several_threads():
    from memory.weightfiles import PAGE, PARALLEL_PIECE, split

    assert split(PARALLEL_PIECE, 8) == [(0, PARALLEL_PIECE)]                       # small: one pread
    assert split(100 << 20, 1) == [(0, 100 << 20)]                                 # one thread asked for
    n = (64 << 20) + 12345
    pieces = split(n, 8)
    assert len(pieces) == 8 and pieces[0][0] == 0 and pieces[-1][1] == n
    assert all(a % PAGE == 0 and b > a for a, b in pieces)
    assert all(p[1] == q[0] for p, q in zip(pieces, pieces[1:]))                   # no gap, no overlap
    assert all(b - a >= PARALLEL_PIECE for a, b in pieces[:-1])


def test_parallel_read_gives_the_same_bytes_as_one_pread(tmp_path):
    from memory.weightfiles import PARALLEL_PIECE

    g = torch.Generator().manual_seed(3)
    big = torch.randint(0, 255, (5 * PARALLEL_PIECE + 777,), dtype=torch.uint8, generator=g)
    save_file({"pad": torch.ones(3, dtype=torch.uint8), "big": big}, str(tmp_path / "model.safetensors"))
    src = WeightFiles.open(tmp_path).tensors["big"]
    one, many = torch.empty(src.nbytes, dtype=torch.uint8), torch.zeros(src.nbytes, dtype=torch.uint8)
    src.file.read_into(one, src.offset, threads=1)
    src.file.read_into(many, src.offset, threads=4)
    assert torch.equal(one, big) and torch.equal(many, big)
    with pytest.raises(WeightFileError, match="unexpected end of file"):             # a piece past the end fails
        src.file.read_into(torch.empty(src.nbytes + (8 << 20), dtype=torch.uint8), src.offset, threads=4)


def _aligned(nbytes: int) -> torch.Tensor:
    from memory.weightfiles import DIRECT_ALIGN

    raw = torch.empty(nbytes + DIRECT_ALIGN, dtype=torch.uint8)
    start = -raw.data_ptr() % DIRECT_ALIGN
    return raw[start:start + nbytes]


def test_direct_read_widens_to_blocks_and_returns_where_the_bytes_start(tmp_path, monkeypatch):
    import os

    from memory.weightfiles import DIRECT_ALIGN, PARALLEL_PIECE

    g = torch.Generator().manual_seed(4)
    big = torch.randint(0, 255, (3 * PARALLEL_PIECE + 4321,), dtype=torch.uint8, generator=g)
    save_file({"pad": torch.ones(5, dtype=torch.uint8), "big": big}, str(tmp_path / "model.safetensors"))
    src = WeightFiles.open(tmp_path).tensors["big"]
    slot = _aligned(4 * PARALLEL_PIECE)
    for threads in (1, 3):
        for pos, n in ((0, 1000), (777, 2 * PARALLEL_PIECE + 5), (src.nbytes - 999, 999)):
            start = src.file.read_direct(slot, src.offset + pos, n, threads=threads)
            if start is None:                                  # this file system refuses O_DIRECT: no harm
                assert not hasattr(os, "O_DIRECT") or src.file._direct == -1
                continue
            assert 0 <= start < DIRECT_ALIGN
            assert torch.equal(slot[start:start + n], big[pos:pos + n])
    assert src.file.read_direct(slot[1:], src.offset, 10) is None                  # an unaligned slot: not direct
    from memory.chunkload import Staging

    assert not Staging(torch.device("cpu"), direct=False).direct                   # turned off: buffered reads


def test_staging_uploads_the_same_bytes_with_and_without_direct_reads(tmp_path, monkeypatch):
    from memory.chunkload import Staging

    g = torch.Generator().manual_seed(5)
    big = torch.randint(0, 255, (3 << 20,), dtype=torch.uint8, generator=g)
    save_file({"pad": torch.ones(3, dtype=torch.uint8), "big": big}, str(tmp_path / "model.safetensors"))
    src = WeightFiles.open(tmp_path).tensors["big"]
    for direct in (True, False):
        staging = Staging(torch.device("cpu"), slot_bytes=1 << 20, direct=direct)    # 3+ pieces through 1 MiB
        staging._buffer = lambda i, s=staging: s._bufs[i] if i < len(s._bufs) else (
            s._bufs.append(_aligned(s.slot_bytes)) or s._bufs[i])
        dst = torch.zeros_like(big)
        staging.upload(src, dst)
        assert torch.equal(dst, big) and staging.bytes_read == big.numel()
