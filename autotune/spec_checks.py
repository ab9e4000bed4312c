"""The value checks of study specs (:mod:`autotune.spec`): numbers and their bounds, the words
a launch carries, the storage scheme and the ``roofline`` section. Each failure is one
:class:`~autotune.errors.SpecError` naming the file and the key (``YamlDoc.error``)."""

from __future__ import annotations

import contextlib
import math
from typing import Any

from sqlalchemy.engine import make_url
from sqlalchemy.exc import NoSuchModuleError

from autotune._yaml import YamlDoc, check_keys
from autotune.model.roofline import get_device
from autotune.space_yaml import MAX_ARG_BYTES

#: bounds on counts (requests, tokens, concurrency, rounds) and on durations: ``num_requests:
#: 1e30`` built a list of that many requests (all memory), and a timeout over ~292 years
#: overflowed every socket and lock wait (OverflowError mid-trial)
MAX_COUNT = 1_000_000
MAX_SECONDS = 7 * 24 * 3600


def number(
    doc: YamlDoc, key: str, value: Any, *, positive: bool = False, integer: bool = False
) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise doc.error(key, f"must be a number, got {value!r}")
    if not math.isfinite(value):  # NaN passes every comparison below
        raise doc.error(key, f"must be a finite number, got {value!r}")
    if integer and not float(value).is_integer():
        raise doc.error(key, f"must be an integer, got {value!r}")
    if positive and value <= 0:
        raise doc.error(key, f"must be > 0, got {value!r}")
    if value < 0:
        raise doc.error(key, f"must be >= 0, got {value!r}")
    return value


def count(doc: YamlDoc, key: str, value: Any, *, positive: bool = True) -> int:
    whole = int(number(doc, key, value, positive=positive, integer=True))
    if whole > MAX_COUNT:
        raise doc.error(key, f"at most {MAX_COUNT:,}, got {value!r}")
    return whole


def seconds(doc: YamlDoc, key: str, value: Any) -> float:
    duration = number(doc, key, value, positive=True)
    if duration > MAX_SECONDS:
        raise doc.error(key, f"at most {MAX_SECONDS:,} seconds (a week), got {value!r}")
    return duration


def launch_word(doc: YamlDoc, key: str, value: Any, prefix: str = "") -> None:
    """A command word or env value: text or a finite number, short enough for Linux to pass
    (one longer word failed every launch with "Argument list too long")."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise doc.error(key, f"must be a string, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise doc.error(key, f"must be a finite number, got {value!r}")
    if len((prefix + str(value)).encode()) >= MAX_ARG_BYTES:
        raise doc.error(
            key, f"longer than a command-line word can be ({MAX_ARG_BYTES - 1:,} bytes)"
        )


def unknown_scheme(url: str) -> str | None:
    """Why SQLAlchemy knows no database ``url`` names (``foo://``), or None."""
    try:
        make_url(url).get_dialect()
    except NoSuchModuleError:
        return f"unknown database scheme {url.split(':', 1)[0]!r} (sqlite, postgresql, mysql...)"
    except Exception:  # noqa: BLE001 - check_url judged the URL; the storage opens it later
        return None
    return None


_ROOFLINE_NUMBERS = {
    "bandwidth_gbs": (False, False),  # (integer, zero allowed)
    "tp": (True, False),
    "context": (True, True),
    "efficiency": (False, False),
    "active_params": (False, False),
    "bits": (False, False),
    "kv_bytes_per_token": (False, True),
    "kv_split_ways": (True, False),
}


def roofline_section(doc: YamlDoc, raw: Any) -> dict[str, Any]:
    """The ``roofline`` section, checked now: it was read only after the study was created
    (a list, a mistyped key or an unknown device failed there, or raised a TypeError). Its
    numbers as numbers: YAML 1.1 reads ``40.0e9`` (no sign after the e) as a string."""
    if raw is None:
        return {}
    out = dict(check_keys(doc, raw, "roofline", {"device", *_ROOFLINE_NUMBERS}))
    for name, (integer, zero) in _ROOFLINE_NUMBERS.items():
        if name not in out:
            continue
        value = out[name]
        if isinstance(value, str):
            with contextlib.suppress(ValueError):  # else refused below, as any non-number
                value = float(value)
        value = number(doc, f"roofline.{name}", value, positive=not zero, integer=integer)
        out[name] = int(value) if integer else float(value)
    if out.get("efficiency", 1) > 1:
        raise doc.error("roofline.efficiency", f"a fraction in (0, 1], got {out['efficiency']!r}")
    if "device" in out:
        if not isinstance(out["device"], str):
            raise doc.error("roofline.device", f"must be a device name, got {out['device']!r}")
        try:
            get_device(out["device"])
        except KeyError as exc:
            raise doc.error("roofline.device", str(exc.args[0])) from None
    elif "bandwidth_gbs" not in out:
        raise doc.error("roofline", "give device (e.g. h200) or bandwidth_gbs")
    if ("active_params" in out) != ("bits" in out):
        raise doc.error("roofline", "give both active_params and bits, or neither (model read)")
    return out
