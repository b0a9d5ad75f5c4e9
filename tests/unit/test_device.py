"""probe_cuda: a cheap yes/no with the reason, never an exception."""

from __future__ import annotations

import ctypes
from typing import Any

import pytest

from handler.backends.device import probe_cuda


def test_cpu_mode_is_not_usable_and_says_why() -> None:
    probe = probe_cuda("cpu")
    assert not probe.usable
    assert probe.reason == "WARMSTART_DEVICE=cpu"


def test_probe_on_this_machine() -> None:
    probe = probe_cuda()
    assert isinstance(probe.reason, str)
    assert probe.reason
    assert probe.usable == bool(probe.devices)


class FakeDriver:
    def __init__(self, init_rc: int = 0, count: int = 1) -> None:
        self.init_rc, self.count = init_rc, count

    def cuInit(self, flags: int) -> int:  # the driver API names its functions in camelCase
        return self.init_rc

    def cuDeviceGetCount(self, ref: Any) -> int:
        ref._obj.value = self.count
        return 0

    def cuDeviceGet(self, ref: Any, i: int) -> int:
        ref._obj.value = i
        return 0

    def cuDeviceGetName(self, buf: Any, size: int, dev: Any) -> int:
        buf.value = f"Fake GPU {dev.value}".encode()
        return 0


def fake_cdll(monkeypatch: pytest.MonkeyPatch, driver: FakeDriver | None) -> None:
    def cdll(name: str) -> FakeDriver:
        assert name == "libcuda.so.1"
        if driver is None:
            raise OSError("libcuda.so.1: cannot open shared object file")
        return driver

    monkeypatch.setattr(ctypes, "CDLL", cdll)


def test_no_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_cdll(monkeypatch, None)
    probe = probe_cuda()
    assert (probe.usable, probe.devices) == (False, [])
    assert probe.reason.startswith("no NVIDIA driver")


def test_cuinit_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_cdll(monkeypatch, FakeDriver(init_rc=100))
    probe = probe_cuda()
    assert not probe.usable
    assert "CUresult 100" in probe.reason


def test_no_device_visible(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_cdll(monkeypatch, FakeDriver(count=0))
    probe = probe_cuda()
    assert not probe.usable
    assert "no CUDA device" in probe.reason


def test_devices_found(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_cdll(monkeypatch, FakeDriver(count=2))
    probe = probe_cuda("cuda")
    assert probe.usable
    assert probe.devices == ["Fake GPU 0", "Fake GPU 1"]
    assert probe.reason == "2 CUDA device(s)"
