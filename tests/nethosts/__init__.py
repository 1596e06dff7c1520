"""Test hosts on this machine: network namespaces, each behind a veth link, and a PostgreSQL
server of the run's own on the other end, for the network fault tests and
``python -m bench.faults --net``.

:class:`NetHosts` makes ``count`` namespaces (``ip netns``). Host ``i`` has one veth link to
the machine's own namespace: its end is ``host.address``, the machine's end
``host.gateway``, a /30 of ``169.254.0.0/16`` (link-local: nothing else answers there).
Programs run inside a host with :meth:`Host.command`; the machine reaches a host's
servers at ``host.address``, and the host reaches the machine's at ``host.gateway``.

Faults, on the traffic between one host and one port of the machine (the database's):

- :meth:`NetHosts.cut`: iptables inside the host drop every packet both ways (nothing is
  refused: connections hang as on a pulled cable); :meth:`NetHosts.heal` removes it all;
- :meth:`NetHosts.slow`: what ``tc qdisc add dev ... netem delay D loss P`` does on the
  host's end, for this machine's kernel has no ``sch_netem``: iptables sends the host's
  packets to the database to a netfilter queue, and :mod:`tests.nethosts.delayer`, inside
  the host, holds each for D ms or drops it with probability P.

:class:`Postgres` is a PostgreSQL server of the run's own (``initdb`` into a new directory,
its own port, listening on the hosts' gateways only): it can be cut off and slowed without
touching the machine's shared server. Needs root (namespaces, and ``runuser`` to run
PostgreSQL as ``postgres``), ``ip`` (iproute2), ``iptables`` and PostgreSQL's binaries:
:func:`unavailable` says what is missing.
"""

from __future__ import annotations

import contextlib
import glob
import ipaddress
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Final

#: Seconds to wait for PostgreSQL or the delayer to start.
TIMEOUT: Final = 60.0
#: The netfilter queue of the delayer (one per host: each host has its own kernel tables).
QUEUE: Final = 0
#: The packet delayer, run inside a host by its path.
DELAYER: Final = Path(__file__).resolve().parent / "delayer.py"
PG_USER: Final = "postgres"


def _postgres_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found is not None:
        return found
    versions = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return versions[-1] if versions else None


def unavailable() -> str | None:
    """Why test hosts cannot be made here, in one line; None when they can."""
    if os.geteuid() != 0:
        return "not root (network namespaces need root)"
    if shutil.which("ip") is None:
        return "no ip command (apt-get install iproute2)"
    if shutil.which("iptables") is None:
        return "no iptables command (apt-get install iptables)"
    if _postgres_bin("initdb") is None or _postgres_bin("postgres") is None:
        return "no PostgreSQL server binaries (apt-get install postgresql)"
    try:
        pwd.getpwnam(PG_USER)
    except KeyError:
        return f"no {PG_USER} user to run PostgreSQL as"
    probe = f"fevtprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot make a network namespace: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _run(*args: str) -> None:
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {done.stderr.strip()}")


@dataclass
class Host:
    name: str
    #: The host's address on its link, and the machine's end of it.
    address: str
    gateway: str
    #: The delayer running inside, while the host is slowed.
    delayer: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def command(self, *args: str) -> list[str]:
        """``args`` run inside the host."""
        return ["ip", "netns", "exec", self.name, *args]

    def iptables(self, *args: str) -> None:
        _run(*self.command("iptables", "-w", *args))


def _free_subnets(count: int) -> list[ipaddress.IPv4Network]:
    """``count`` /30s of 169.254.0.0/16 that no route of this machine uses."""
    routes = subprocess.run(["ip", "-4", "route", "show", "table", "all"], capture_output=True,
                            text=True).stdout  # fmt: skip
    taken = [
        ipaddress.ip_network(word, strict=False)
        for line in routes.splitlines()
        for word in line.split()[:1]
        if word[0].isdigit()
    ]
    base = 16 + os.getpid() % 200
    found: list[ipaddress.IPv4Network] = []
    for third in [*range(base, 255), *range(16, base)]:
        for fourth in range(0, 256, 4):
            net = ipaddress.IPv4Network(f"169.254.{third}.{fourth}/30")
            if not any(net.overlaps(other) for other in taken):
                found.append(net)
                if len(found) == count:
                    return found
    raise RuntimeError("no free subnet in 169.254.0.0/16")


class _Closing:
    """``with`` ends in :meth:`close`."""

    def close(self) -> None:
        raise NotImplementedError

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _exc: BaseException | None,
        _tb: TracebackType | None,
    ) -> None:
        self.close()


class NetHosts(_Closing):
    """``count`` namespaces with a veth link each; removed on exit."""

    def __init__(self, count: int = 2) -> None:
        self.count = count
        self.hosts: list[Host] = []

    def __enter__(self) -> NetHosts:
        tag = f"fe{os.getpid() % 100000}"
        try:
            for number, net in enumerate(_free_subnets(self.count)):
                name, outer, inner = f"{tag}h{number}", f"{tag}v{number}", f"{tag}i{number}"
                gateway, address = (str(a) for a in net.hosts())
                _run("ip", "netns", "add", name)
                self.hosts.append(Host(name, address, gateway))
                _run("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
                _run("ip", "link", "set", inner, "netns", name)
                _run("ip", "addr", "add", f"{gateway}/30", "dev", outer)
                _run("ip", "link", "set", outer, "up")
                _run("ip", "-n", name, "addr", "add", f"{address}/30", "dev", inner)
                _run("ip", "-n", name, "link", "set", inner, "up")
                _run("ip", "-n", name, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        for host in self.hosts:
            self._stop_delayer(host)
            # the veth pair goes with the namespace that holds one end
            subprocess.run(["ip", "netns", "del", host.name], capture_output=True)
        self.hosts.clear()

    def cut(self, host: Host, port: int) -> None:
        """Drop every packet between ``host`` and the machine's ``port``, both ways."""
        host.iptables("-I", "OUTPUT", "-d", host.gateway, "-p", "tcp", "--dport", str(port),
                      "-j", "DROP")  # fmt: skip
        host.iptables("-I", "INPUT", "-s", host.gateway, "-p", "tcp", "--sport", str(port),
                      "-j", "DROP")  # fmt: skip

    def slow(self, host: Host, port: int, delay_ms: float, loss: float, seed: int = 1) -> None:
        """Hold each packet from ``host`` to the machine's ``port`` ``delay_ms``, and drop
        it with probability ``loss`` (netem on the host's end of the link)."""
        self._stop_delayer(host)
        delayer = subprocess.Popen(
            # run by its path: the tests' package need not be importable (PYTHONSAFEPATH)
            host.command(sys.executable, str(DELAYER), "--queue", str(QUEUE),
                         "--delay-ms", str(delay_ms), "--loss", str(loss), "--seed", str(seed)),
            stdout=subprocess.PIPE,
        )  # fmt: skip
        assert delayer.stdout is not None
        host.delayer = delayer
        if delayer.stdout.readline().strip() != b"ready":
            self._stop_delayer(host)
            raise RuntimeError("the packet delayer did not start")
        host.iptables("-I", "OUTPUT", "-d", host.gateway, "-p", "tcp", "--dport", str(port),
                      "-j", "NFQUEUE", "--queue-num", str(QUEUE), "--queue-bypass")  # fmt: skip

    def heal(self, host: Host) -> None:
        """Every fault of ``host`` gone."""
        host.iptables("-F", "OUTPUT")
        host.iptables("-F", "INPUT")
        self._stop_delayer(host)

    @staticmethod
    def _stop_delayer(host: Host) -> None:
        delayer, host.delayer = host.delayer, None
        if delayer is not None:
            delayer.send_signal(signal.SIGTERM)
            try:
                delayer.wait(10)
            except subprocess.TimeoutExpired:
                delayer.kill()
                delayer.wait()
            if delayer.stdout is not None:
                delayer.stdout.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Postgres(_Closing):
    """A PostgreSQL server of its own in a new directory, listening on ``addresses`` (and
    a Unix socket in its directory); removed on exit."""

    def __init__(self, addresses: list[str], port: int | None = None) -> None:
        self.addresses = addresses
        self.port = port or free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="futoin-evt-pg-"))
        self.data = self.dir / "data"
        self.log = self.dir / "server.log"

    def url(self, address: str) -> str:
        return f"postgresql://{PG_USER}@{address}:{self.port}/postgres"

    def _as_postgres(self, *args: str) -> list[str]:
        return ["runuser", "-u", PG_USER, "--", *args]

    def __enter__(self) -> Postgres:
        user = pwd.getpwnam(PG_USER)
        os.chown(self.dir, user.pw_uid, user.pw_gid)
        initdb, server = _postgres_bin("initdb"), _postgres_bin("postgres")
        assert initdb is not None
        assert server is not None
        _run(*self._as_postgres(initdb, "-D", str(self.data), "-U", PG_USER, "--auth=trust",
                                "--no-sync", "-E", "UTF8"))  # fmt: skip
        with open(self.data / "pg_hba.conf", "a") as hba:  # the hosts' links, no password
            hba.write("host all all 169.254.0.0/16 trust\n")
        settings = {
            "listen_addresses": ",".join(self.addresses),
            "port": str(self.port),
            "unix_socket_directories": str(self.dir),
            "max_connections": "200",
            "shared_buffers": "64MB",
            "fsync": "on",
        }
        options = [arg for name, value in settings.items() for arg in ("-c", f"{name}={value}")]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self._as_postgres(server, "-D", str(self.data), *options),
                                         stdout=log, stderr=log)  # fmt: skip
        deadline = time.monotonic() + TIMEOUT
        while not self._ready():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"PostgreSQL did not start: {self.tail()}")
            time.sleep(0.05)  # the server says it is ready in a file, and signals nothing
        return self

    def _ready(self) -> bool:
        """postmaster.pid's last line is the server's state: ``ready`` once it accepts."""
        with contextlib.suppress(OSError):
            return (self.data / "postmaster.pid").read_text().split()[-1:] == ["ready"]
        return False

    def tail(self, lines: int = 5) -> str:
        with contextlib.suppress(OSError):
            return " | ".join(self.log.read_text().strip().splitlines()[-lines:])
        return ""

    def close(self) -> None:
        proc = getattr(self, "proc", None)
        if proc is not None and proc.poll() is None:
            # the postmaster itself (runuser does not pass signals on): a fast shutdown
            with contextlib.suppress(OSError, ValueError, IndexError):
                pid = int((self.data / "postmaster.pid").read_text().split()[0])
                os.kill(pid, signal.SIGINT)
            try:
                proc.wait(TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
