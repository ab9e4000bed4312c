"""Words that would make a server listen on every network interface.

autotune's servers listen on 127.0.0.1 only, the address it gives each launch. A fixed word of
the spec (``engine.command``, ``engine.args``) or a tuned value (a choice, a baseline) that
names every interface is refused by the loaders (:mod:`autotune.spec.checks`,
:mod:`autotune.space.load`), whichever flag carries it: a server may take its address from a
flag autotune does not know (``--bind``, ``--listen``).

What names every interface is what the resolvers read so, not only ``0.0.0.0`` and ``::``:
``getaddrinfo`` and ``inet_aton`` read ``0``, ``0.0``, ``0x0`` and ``000.000.000.000`` as
0.0.0.0 (one to four parts, each decimal, octal or hex), and a server given ``:8000`` binds
every interface too. To keep false positives low, a word is read as an address only where it
cannot be anything else:

* an address written in full (``0.0.0.0``, ``::``, ``000.000.000.000``, four parts), or the
  IPv4-mapped ``::ffff:0.0.0.0``;
* a host with a port or a scheme (``0:8000``, ``[::]:80``, ``http://0``, ``:8000``);
* a short spelling (``0``, ``0.0``, ``0x0``) or an empty host or ``*`` only as the value of a
  flag, variable or JSON key whose name says it takes an address (``--bind``, ``--host``,
  ``LISTEN_ADDR``, ``server.ip``; :func:`takes_address`): ``--temperature 0.0``,
  ``--max-loras 0`` and ``VLLM_CPU_OMP_THREADS_BIND=0`` are no addresses.
"""

from __future__ import annotations

import ipaddress
import re

from autotune.space.model import Parameter

#: a name part that says the value is where a server listens (``--http-host``,
#: ``LISTEN_ADDRESS``, a JSON key ``ip``); ``bind`` only alone (``--bind``): in
#: ``VLLM_CPU_OMP_THREADS_BIND`` it binds threads to cores, and ``0`` is a core
_ADDRESS_WORDS = frozenset(
    {"host", "hostname", "addr", "address", "listen", "ip", "interface", "iface"}
)
#: one part of an IPv4 address as ``inet_aton`` reads it that is zero: ``0``, ``000``, ``0x0``
_ZERO = r"(?:0[xX]0*|0+)"
#: 0.0.0.0 in one to four parts (``inet_aton`` fills the missing parts with zeros)
_ZERO_IPV4 = re.compile(rf"{_ZERO}(?:\.{_ZERO}){{0,3}}")
_SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*://", re.IGNORECASE)


def takes_address(name: str | None) -> bool:
    """Whether a flag, an environment variable or a JSON key is named for an address."""
    if not name:
        return False
    parts = re.split(r"[-_.]+", name.strip("-").lower())
    if "port" in parts:  # ``--listen-port 0``: a port, not an address
        return False
    return parts == ["bind"] or any(part in _ADDRESS_WORDS for part in parts)


def any_address(word: str, flag: str | None = None) -> bool:
    """Whether ``word`` (a command-line word, a tuned value) names every interface: the word
    itself, its ``--flag=`` value, the host of ``host:port`` or of a URL. ``flag`` is the flag
    (variable, JSON key) it is the value of, if any: a short spelling such as ``0`` is an
    address only there (module docstring)."""
    text = word
    if word.startswith("-") and "=" in word:
        flag, text = word.split("=", 1)
    host, qualified = _host(text)
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    if address is not None:
        mapped = getattr(address, "ipv4_mapped", None)
        return address.is_unspecified or (mapped is not None and mapped.is_unspecified)
    if qualified and host in ("", "*"):  # ":8000", "*:8000", "http://:80"
        return True
    if host in ("", "*"):
        return takes_address(flag)
    if not _ZERO_IPV4.fullmatch(host):
        return False
    return qualified or host.count(".") == 3 or takes_address(flag)


def _host(text: str) -> tuple[str, bool]:
    """The host part of ``text``, and whether a scheme or a port said it is one."""
    rest = _SCHEME.sub("", text)
    qualified = rest != text
    rest = rest.split("/", 1)[0]
    bracketed = re.fullmatch(r"\[([^\]]*)\](:\d*)?", rest)
    if bracketed:
        return bracketed.group(1), qualified or bracketed.group(2) is not None
    if rest.count(":") == 1:  # IPv4 host:port (IPv6 has more colons)
        host, port = rest.split(":", 1)
        if port.isdigit():
            return host, True
    return rest, qualified


def value_address_problem(param: Parameter) -> tuple[str, str] | None:
    """A tuned value of ``param`` that names every interface, as (the key under the parameter,
    why), or None. Its choices (the baseline is one of them), or 0 in a numeric domain whose
    target is named for an address (``--bind 0``)."""
    target = param.target
    if target.kind == "patch":
        return None
    carrier = target.key.rsplit(".", 1)[-1] if target.kind == "json" else target.name
    if param.type == "categorical":
        for index, choice in enumerate(param.choices):
            if choice is None or isinstance(choice, bool):
                continue
            if any_address(str(choice), carrier):
                return f"choices[{index}]", _why(str(choice), target.describe())
    elif param.type in ("int", "float") and takes_address(carrier) and param.contains(0):
        return "low", _why("0", target.describe())
    return None


def _why(value: str, where: str) -> str:
    return (
        f"{value!r} ({where}) listens on every network interface: autotune's servers listen "
        "on 127.0.0.1 only, the address it gives each launch"
    )
