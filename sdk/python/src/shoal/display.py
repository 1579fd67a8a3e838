"""Events for a ``vm`` sandbox's display (``sandbox.input(events)``) and
what its screenshots are (``sandbox.screen()``: PNG bytes).

Each helper returns a list of events (the API's JSON objects), so that
they add up::

    from shoal import display as d
    await sb.input(d.move(16384, 16384) + d.click() + d.type_text("ls -l") + d.key("ret"))

Keys are QEMU key code names (``a``, ``1``, ``ret``, ``spc``, ``shift``,
``ctrl``, ``alt``, ``f1``, ``esc``, ``tab``, ``backspace``, ``up``...);
the pointer is absolute, 0..32767 across each axis of the screen.
"""

from __future__ import annotations

import re
import struct
from typing import Any, Iterable, List, Mapping

__all__ = [
    "POINTER_MAX",
    "MAX_EVENTS",
    "key",
    "key_down",
    "key_up",
    "move",
    "click",
    "button",
    "type_text",
    "check_events",
    "png_size",
]

#: Absolute pointer coordinates run 0..=this across the screen.
POINTER_MAX = 32767
#: Most events the daemon takes in one request (``input`` sends more in
#: several requests, in order).
MAX_EVENTS = 256
BUTTONS = ("left", "middle", "right", "wheel-up", "wheel-down")
_KEY = re.compile(r"^[a-z0-9_]{1,24}$")

Event = Mapping[str, Any]

# What typing a character takes on a US layout: (key, with shift).
_CHARS: dict[str, tuple[str, bool]] = {
    " ": ("spc", False),
    "\n": ("ret", False),
    "\t": ("tab", False),
    "-": ("minus", False),
    "=": ("equal", False),
    ",": ("comma", False),
    ".": ("dot", False),
    "/": ("slash", False),
    ";": ("semicolon", False),
    "'": ("apostrophe", False),
    "[": ("bracket_left", False),
    "]": ("bracket_right", False),
    "\\": ("backslash", False),
    "`": ("grave_accent", False),
    "_": ("minus", True),
    "+": ("equal", True),
    "<": ("comma", True),
    ">": ("dot", True),
    "?": ("slash", True),
    ":": ("semicolon", True),
    '"': ("apostrophe", True),
    "{": ("bracket_left", True),
    "}": ("bracket_right", True),
    "|": ("backslash", True),
    "~": ("grave_accent", True),
}
_CHARS.update({s: (d, True) for d, s in zip("1234567890", "!@#$%^&*()")})


def _key_name(name: str) -> str:
    if not isinstance(name, str) or not _KEY.match(name):
        raise ValueError(f"key {name!r}: expected a QEMU key code name (a, ret, shift, f1, ...)")
    return name


def key_down(name: str) -> List[Event]:
    """The key ``name`` goes down."""
    return [{"type": "key", "key": _key_name(name), "down": True}]


def key_up(name: str) -> List[Event]:
    """The key ``name`` goes up."""
    return [{"type": "key", "key": _key_name(name), "down": False}]


def key(name: str, *modifiers: str) -> List[Event]:
    """A press of ``name`` (down, then up), with ``modifiers`` held
    (``key("c", "ctrl")``)."""
    out: List[Event] = []
    for m in modifiers:
        out += key_down(m)
    out += key_down(name) + key_up(name)
    for m in reversed(modifiers):
        out += key_up(m)
    return out


def move(x: int, y: int) -> List[Event]:
    """The pointer moves to (``x``, ``y``), each 0..32767 across the screen."""
    for v in (x, y):
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= POINTER_MAX:
            raise ValueError(f"pointer position {v!r}: expected an int 0..{POINTER_MAX}")
    return [{"type": "move", "x": x, "y": y}]


def button(name: str, down: bool) -> List[Event]:
    """The pointer button ``name`` (left, middle, right, wheel-up,
    wheel-down) goes down or up."""
    if name not in BUTTONS:
        raise ValueError(f"button {name!r}: expected one of {', '.join(BUTTONS)}")
    return [{"type": "button", "button": name, "down": bool(down)}]


def click(name: str = "left") -> List[Event]:
    """A click of the pointer button ``name`` (down, then up)."""
    return button(name, True) + button(name, False)


def type_text(text: str) -> List[Event]:
    """The key presses that type ``text`` on a US layout (letters,
    digits, punctuation, space, tab, newline); ValueError for a character
    that has no key there."""
    out: List[Event] = []
    for ch in text:
        if "a" <= ch <= "z" or "0" <= ch <= "9":
            out += key(ch)
        elif "A" <= ch <= "Z":
            out += key(ch.lower(), "shift")
        elif ch in _CHARS:
            k, shift = _CHARS[ch]
            out += key(k, "shift") if shift else key(k)
        else:
            raise ValueError(f"cannot type {ch!r}: no key for it on a US layout")
    return out


def check_events(events: Iterable[Event]) -> List[dict[str, Any]]:
    """``events`` as a list of JSON objects, each with a known ``type``
    (the daemon checks the rest: 400). ValueError when empty."""
    out = []
    for e in events:
        if not isinstance(e, Mapping) or e.get("type") not in ("key", "move", "button"):
            raise ValueError(f"not an input event: {e!r} (see shoal.display)")
        out.append(dict(e))
    if not out:
        raise ValueError("no input events")
    return out


def png_size(png: bytes) -> tuple[int, int]:
    """(width, height) of the PNG ``png``; ValueError if it is not one."""
    if len(png) < 24 or png[:8] != b"\x89PNG\r\n\x1a\n" or png[12:16] != b"IHDR":
        raise ValueError("not a PNG image")
    w, h = struct.unpack(">II", png[16:24])
    return int(w), int(h)
