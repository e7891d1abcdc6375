"""``retain_freed_memory``: the extraction's forward pass reuses freed pages (issue 29)."""

from __future__ import annotations

import resource
import sys

import pytest

from fedalign.extract import device
from fedalign.extract.device import retain_freed_memory


class _FakeLibc:
    def __init__(self):
        self.calls = []

    def mallopt(self, param, value):
        self.calls.append(("mallopt", param, value))
        return 1

    def malloc_trim(self, pad):
        self.calls.append(("malloc_trim", pad))
        return 1


@pytest.fixture
def fake_libc(monkeypatch):
    libc = _FakeLibc()
    monkeypatch.setattr(device, "_libc", lambda: libc)
    for k in device._MALLOC_ENV:
        monkeypatch.delenv(k, raising=False)
    return libc


def test_sets_on_entry_and_restores_glibc_defaults_once_at_the_outermost_exit(fake_libc):
    with retain_freed_memory():
        assert fake_libc.calls == [("malloc_trim", 0), ("mallopt", -4, 0),
                                   ("mallopt", -1, 2**31 - 1)]
        with retain_freed_memory():
            pass
        assert len(fake_libc.calls) == 3  # the inner block sets and restores nothing
    assert fake_libc.calls[3:] == [("mallopt", -4, 65536), ("mallopt", -1, 128 * 1024),
                                   ("malloc_trim", 0)]


def test_restores_when_the_block_raises(fake_libc):
    with pytest.raises(KeyboardInterrupt):
        with retain_freed_memory():
            raise KeyboardInterrupt
    assert fake_libc.calls[-1] == ("malloc_trim", 0)
    assert device._retaining == 0


def test_the_users_malloc_tunables_are_kept(fake_libc, monkeypatch):
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "0")
    with retain_freed_memory():
        pass
    assert fake_libc.calls == []


@pytest.mark.skipif(not sys.platform.startswith("linux") or device._libc() is None,
                    reason="glibc only")
def test_a_forward_like_loop_is_not_faulted_in_again_each_batch():
    torch = pytest.importorskip("torch")
    sizes = [2**24, 3 * 2**22, 2**24, 2**23, 5 * 2**21]  # 64, 48, 64, 32, 40 MiB float32

    def batch():  # layer by layer: the next activation is made, then the previous one freed
        prev = torch.ones(sizes[0])
        for s in sizes[1:]:
            nxt = torch.empty(s).fill_(2.0)
            del prev
            prev = nxt
        del prev

    def faults(batches=8):
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(batches):
            batch()
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0

    batch()
    outside = faults()  # over glibc's largest mmap threshold: mmap'd and faulted in every time
    with retain_freed_memory():
        batch(), batch()  # the heap grows (once, or twice when it held fragments)
        inside = faults()
    pages = sum(4 * n for n in sizes if 4 * n > 2**25) // 4096 * 8  # 55,296 a batch, 8 batches
    assert outside > pages / 2, (outside, pages)  # margin: a huge page or a threshold move
    assert inside < outside / 10, (inside, outside)
