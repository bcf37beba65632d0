"""Corpus family 5: name resolution of the job's trays, one case per id.

``dns`` cases change what the resolver (``FakeHost.resolve``, standing for
getaddrinfo) answers per name: a list of addresses, or ``None`` for a name
that does not resolve; ``fails`` makes the resolver fail with that reason.
``hosts`` cases use ``[resolve] method = hosts_file`` with that file's text.
A case fails with ``code`` naming ``names``, or succeeds with ``nodes`` as the
nodes file.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping


@dataclasses.dataclass(frozen=True)
class ResolveCase:
    """One way the trays' names resolve (or do not) and what the prolog must do."""

    id: str
    dns: Mapping[str, list[str] | None] = dataclasses.field(default_factory=dict)
    hosts: str | None = None
    nodelist: str = "gb[01-02]"
    fails: str | None = None
    code: str = "resolve_failed"
    exit_code: int = 69
    names: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ()


def _ok(id_: str, nodes: tuple[str, ...], **kw: object) -> ResolveCase:
    return ResolveCase(id_, code="", exit_code=0, nodes=nodes, **kw)  # type: ignore[arg-type]


_NOT_V4 = "no non-loopback IPv4 address"

DNS = [
    ResolveCase("dns-unresolvable-peer", {"gb02": None}, names=("gb02: cannot resolve 'gb02'",)),
    ResolveCase("dns-unresolvable-self", {"gb01": None}, names=("gb01: cannot resolve 'gb01'",)),
    ResolveCase("dns-unresolvable-all", {f"gb0{i}": None for i in range(1, 5)}, nodelist="gb[01-04]",
                names=("gb01: cannot", "gb02: cannot", "gb03: cannot", "gb04: cannot")),
    ResolveCase("dns-unresolvable-seven-of-eight", {f"gb0{i}": None for i in range(2, 9)}, nodelist="gb[01-08]",
                names=("gb02: cannot", "gb06: cannot", "and 2 others")),
    ResolveCase("dns-resolver-fails", fails="Temporary failure in name resolution",
                names=("gb01: cannot resolve", "Temporary failure in name resolution")),
    ResolveCase("dns-ipv6-only", {"gb02": ["fd00::2"]}, names=("gb02: " + _NOT_V4, "fd00::2")),
    ResolveCase("dns-ipv6-link-local-only", {"gb02": ["fe80::2"]}, names=("gb02: " + _NOT_V4, "fe80::2")),
    ResolveCase("dns-ipv4-mapped-ipv6", {"gb02": ["::ffff:10.0.0.2"]}, names=("gb02: " + _NOT_V4,)),
    ResolveCase("dns-loopback-only", {"gb02": ["127.0.1.1"]}, names=("gb02: " + _NOT_V4, "127.0.1.1")),
    ResolveCase("dns-loopback-and-ipv6", {"gb01": ["127.0.0.1", "::1"]}, names=("gb01: " + _NOT_V4,)),
    ResolveCase("dns-unspecified-only", {"gb02": ["0.0.0.0"]}, names=("gb02: " + _NOT_V4, "0.0.0.0")),
    ResolveCase("dns-multicast-only", {"gb02": ["224.0.0.2"]}, names=("gb02: " + _NOT_V4, "224.0.0.2")),
    ResolveCase("dns-broadcast-only", {"gb02": ["255.255.255.255"]}, names=("gb02: " + _NOT_V4,)),
    ResolveCase("dns-reserved-only", {"gb02": ["240.0.0.2"]}, names=("gb02: " + _NOT_V4, "240.0.0.2")),
    ResolveCase("dns-empty-answer", {"gb02": []}, names=("gb02: " + _NOT_V4, "resolver gave nothing")),
    ResolveCase("dns-two-ipv4-addresses", {"gb02": ["10.0.0.2", "10.1.0.2"]},
                names=("gb02: ambiguous, several IPv4 addresses", "10.1.0.2", "hosts_file")),
    ResolveCase("dns-two-ipv4-self", {"gb01": ["10.0.0.1", "192.168.0.1"]}, names=("gb01: ambiguous",)),
    ResolveCase("dns-two-trays-one-address", {"gb02": ["10.0.0.1"]},
                names=("gb01 and gb02 resolve to the same address 10.0.0.1",)),
    ResolveCase("dns-three-trays-two-share", {"gb03": ["10.0.0.2"]}, nodelist="gb[01-03]",
                names=("gb02 and gb03 resolve to the same address 10.0.0.2",)),
    ResolveCase("dns-self-takes-peer-address", {"gb01": ["10.0.0.2"]},
                names=("gb01 and gb02 resolve to the same address 10.0.0.2",)),
    ResolveCase("dns-non-ascii-name", nodelist="gb01,gb\u00e902", names=("gb\u00e902: cannot resolve",)),
    ResolveCase("dns-homoglyph-name", nodelist="gb01,\u0261b02", names=("\u0261b02: cannot resolve",)),
    _ok("dns-ipv6-then-ipv4", ("10.0.0.1", "10.0.0.2"), dns={"gb02": ["fd00::2", "10.0.0.2"]}),
    _ok("dns-loopback-then-ipv4", ("10.0.0.1", "10.0.0.2"), dns={"gb02": ["127.0.1.1", "10.0.0.2"]}),
    _ok("dns-unspecified-then-ipv4", ("10.0.0.1", "10.0.0.2"), dns={"gb02": ["0.0.0.0", "10.0.0.2"]}),
    _ok("dns-other-subnet", ("10.0.0.1", "172.16.5.2"), dns={"gb02": ["172.16.5.2"]}),
]  # fmt: skip

HOSTS = [
    ResolveCase("hosts-peer-missing", hosts="10.0.0.1 gb01\n", names=("gb02: not in", "etc/imexctl/hosts")),
    ResolveCase("hosts-all-missing", hosts="# empty\n", names=("gb01: not in", "gb02: not in")),
    # /etc/hosts matches names without regard to case (glibc's files source: strcasecmp), and so does imexctl
    _ok("hosts-name-case-differs", ("10.0.0.1", "10.0.0.2"), hosts="10.0.0.1 gb01\n10.0.0.2 GB02\n"),
    ResolveCase("hosts-name-case-differs-two-addresses", hosts="10.0.0.1 gb01\n10.0.0.2 gb02\n10.0.0.3 GB02\n",
                code="config_invalid", exit_code=78, names=("GB02 has two addresses (10.0.0.2, 10.0.0.3)",)),
    ResolveCase("hosts-only-an-alias", hosts="10.0.0.1 gb01\n10.0.0.2 gb02-ib\n", names=("gb02: not in",)),
    ResolveCase("hosts-commented-out", hosts="10.0.0.1 gb01\n# 10.0.0.2 gb02\n", names=("gb02: not in",)),
    ResolveCase("hosts-two-trays-one-line", hosts="10.0.0.1 gb01 gb02\n",
                names=("gb01 and gb02 resolve to the same address 10.0.0.1",)),
    ResolveCase("hosts-two-trays-one-address", hosts="10.0.0.1 gb01\n10.0.0.1 gb02\n",
                names=("gb01 and gb02 resolve to the same address 10.0.0.1",)),
    ResolveCase("hosts-one-name-two-addresses", hosts="10.0.0.1 gb01\n10.0.0.2 gb02\n10.0.0.3 gb02\n",
                code="config_invalid", exit_code=78, names=("gb02 has two addresses (10.0.0.2, 10.0.0.3)",)),
    _ok("hosts-ipv6-as-written", ("10.0.0.1", "fd00::2"), hosts="10.0.0.1 gb01\nfd00::2 gb02\n"),
    _ok("hosts-loopback-as-written", ("127.0.0.11", "127.0.0.12"), hosts="127.0.0.11 gb01\n127.0.0.12 gb02\n"),
    _ok("hosts-resolver-not-asked", ("10.9.0.1", "10.9.0.2"), hosts="10.9.0.1 gb01\n10.9.0.2 gb02\n",
        dns={"gb01": None, "gb02": None}),
]  # fmt: skip

CASES = [*DNS, *HOSTS]
