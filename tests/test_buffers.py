"""Fresh output buffers (:mod:`linattn.buffers`): large ones on their own huge-page mapping, released with the
tensor; small ones from torch's allocator."""

from __future__ import annotations

import gc
import os

import pytest
import torch

from linattn import buffers


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("shape", [(3, 5), (0, 7), (2, 1024, 1024), (9, 1024, 1024), (7, 333, 1111)])
def test_empty_is_a_plain_contiguous_tensor(shape, dtype):
    x = buffers.empty(shape, dtype)
    assert x.shape == shape and x.dtype == dtype and x.is_contiguous() and x.device.type == "cpu"
    x.fill_(3)
    assert bool((x == 3).all())
    big = x.numel() * x.element_size() >= buffers.MIN_BYTES
    if big and buffers.hugepage_capable():
        assert x.data_ptr() % buffers.HUGE_PAGE == 0  # its own mapping, aligned for huge pages
        assert not x.untyped_storage().resizable()
    else:
        assert x.untyped_storage().resizable()  # torch's allocator


@pytest.mark.skipif(not buffers.hugepage_capable(), reason="no anonymous mmap here")
def test_large_buffers_are_released_with_their_tensor():
    """2 GiB in 32 buffers of 64 MiB, each written and dropped: resident memory comes back each time."""
    gc.collect()
    before = rss_bytes()
    for _ in range(32):
        x = buffers.empty((16 << 20,))
        x.fill_(1.0)
        del x
        assert rss_bytes() - before < 32 << 20


def test_falls_back_to_torch_when_no_mapping_or_no_advice(monkeypatch):
    """A failed mmap or madvise, or a platform without them, still gives a working tensor."""
    import mmap

    def refuse(*args, **kwargs):
        raise OSError("no")

    shape = (buffers.MIN_BYTES // 4 + 16,)
    monkeypatch.setattr(mmap, "mmap", refuse)
    x = buffers.empty(shape)
    assert x.shape == shape and x.untyped_storage().resizable()
    monkeypatch.undo()
    monkeypatch.setattr(buffers, "_ADVISE", -12345)  # an advice the kernel rejects: plain pages, same mapping
    if buffers.hugepage_capable():
        y = buffers.empty(shape)
        y.fill_(2.0)
        assert y.shape == shape and bool((y == 2.0).all()) and not y.untyped_storage().resizable()
    monkeypatch.setattr(buffers, "_ADVISE", None)
    z = buffers.empty(shape)
    assert z.shape == shape and z.untyped_storage().resizable()
