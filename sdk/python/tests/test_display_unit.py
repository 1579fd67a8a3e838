"""The display helpers and the vm entry point's own logic, no daemon:
events are built and checked, screenshots' sizes read, vm templates
named and their kind parsed."""

from __future__ import annotations

import struct
import zlib

import pytest

import shoal
from shoal import display as d


def test_keys_and_modifiers():
    assert d.key("a") == [
        {"type": "key", "key": "a", "down": True},
        {"type": "key", "key": "a", "down": False},
    ]
    assert [(e["key"], e["down"]) for e in d.key("c", "ctrl", "alt")] == [
        ("ctrl", True), ("alt", True), ("c", True), ("c", False), ("alt", False), ("ctrl", False),
    ]
    assert d.key_down("f1") + d.key_up("f1") == d.key("f1")
    for bad in ("", "A", "a;quit", "x" * 25, 3):
        with pytest.raises(ValueError, match="key code"):
            d.key(bad)  # type: ignore[arg-type]


def test_typing_text_on_a_us_layout():
    ev = d.type_text("aB1 !\n")
    downs = [(e["key"]) for e in ev if e["down"]]
    assert downs == ["a", "shift", "b", "1", "spc", "shift", "1", "ret"]
    assert sum(1 for e in ev if e["down"]) == sum(1 for e in ev if not e["down"])
    with pytest.raises(ValueError, match="no key"):
        d.type_text("é")


def test_pointer_events_are_checked():
    assert d.move(0, d.POINTER_MAX) == [{"type": "move", "x": 0, "y": 32767}]
    for x in (-1, 32768, 1.5, True):
        with pytest.raises(ValueError, match="pointer position"):
            d.move(x, 0)  # type: ignore[arg-type]
    assert [e["down"] for e in d.click("right")] == [True, False]
    with pytest.raises(ValueError, match="button"):
        d.button("thumb", True)


def test_check_events():
    evs = d.move(1, 2) + d.click()
    assert d.check_events(iter(evs)) == evs
    with pytest.raises(ValueError, match="no input events"):
        d.check_events([])
    for bad in ({"type": "scroll"}, "key a", {"key": "a"}):
        with pytest.raises(ValueError, match="not an input event"):
            d.check_events([bad])  # type: ignore[list-item]


def _png(w: int, h: int) -> bytes:
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    chunk = struct.pack(">I", len(ihdr)) + b"IHDR" + ihdr
    return b"\x89PNG\r\n\x1a\n" + chunk + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))


def test_png_size():
    assert d.png_size(_png(720, 400)) == (720, 400)
    for bad in (b"", b"GIF89a" + b"\0" * 30, _png(1, 1)[:20]):
        with pytest.raises(ValueError, match="not a PNG"):
            d.png_size(bad)


def test_vm_args_and_template_kind():
    a = shoal.VMArgs()
    assert (a.image, a.vcpus, a.memory_mib) == ("tiny", 1, 256)
    assert a.template_name() == "vm-tiny-1c-256m"
    assert shoal.VMArgs(vcpus=2, memory_mib=512).template_name() == "vm-tiny-2c-512m"
    assert shoal.VMArgs(template="desk").template_name() == "desk"
    base = {"name": "t", "source": "image:tiny", "state": "ready", "vcpus": 1, "memory_mib": 256}
    assert shoal.TemplateInfo.from_json({**base, "kind": "vm"}).kind == "vm"
    # Older daemons say nothing: theirs are microVMs.
    assert shoal.TemplateInfo.from_json(base).kind == "microvm"


def test_sandboxes_have_a_display_api_in_both_clients():
    for cls in (shoal.Sandbox, shoal.AsyncSandbox):
        assert callable(cls.screen) and callable(cls.input)
    for cls in (shoal.Shoal, shoal.AsyncShoal):
        assert "kind" in cls.create_template.__code__.co_varnames
