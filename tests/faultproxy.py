"""A TCP proxy between Redis clients and a real ``redis-server`` that
misbehaves on purpose: it loses replies and cuts Redis off.

Nothing here is a mock: every command reaches the real server and runs
there. What the proxy breaks is the way back, as a flaky network or a
failover would:

* **Lost replies** (:meth:`FaultProxy.lose_replies`): a chosen command runs
  in Redis, but its client never gets the reply. ``"drop"`` closes the
  connection once Redis has answered; ``"hold"`` keeps the reply until the
  client gives up (its socket timeout) or ``hold`` seconds pass, then
  closes. The command is chosen by a byte pattern in what the client sends
  (``b"EXEC"``, a script's SHA1), by its name, or by the Lua script it runs
  (``script=``: the script's source, or a part of it; the proxy learns the
  SHA1 of every script loaded through it, so a script loaded with a prefix
  still matches), and optionally by a pattern in the reply.
* **Random losses** (:meth:`FaultProxy.lose_randomly`): about one client
  write in ``one_in`` has the reply to its last command lost, drawn from a
  seeded :class:`random.Random`.
* **Outages** (:meth:`FaultProxy.begin_outage`, :meth:`FaultProxy.outage`):
  every connection is cut and new ones are refused (the listening socket is
  closed) until the outage ends; Redis itself keeps running. A rule with
  ``mode="outage"`` starts one right after a chosen reply was delivered.
* **A failover behind an endpoint** (:meth:`FaultProxy.switch_upstream`):
  new connections go to another server, those open stay with the old one.
* **What was sent** (:meth:`FaultProxy.commands`): every command seen, in
  order, with its connection.

How the proxy knows that Redis ran a command before it loses the reply: it
parses both directions of each connection. Every complete command the client
sends (RESP arrays, or inline commands) adds one expected reply to the
connection's queue, in order; every complete reply from Redis (a small RESP2
and RESP3 reply parser) takes the next one. A command's reply is only lost
once its own reply has been read in full from Redis, so Redis has run it,
and the replies of the commands before it are delivered first. Inside
``MULTI`` a command is only queued (``+QUEUED``): a match there loses the
reply to the transaction's ``EXEC``, once the whole transaction has run.
redis-py pipelines send ``MULTI``, the commands and ``EXEC`` in one write;
this is why replies are counted, not writes.

Use::

    with FaultProxy(redis_url) as proxy:
        client = redis.Redis.from_url(proxy.url)
        proxy.lose_replies(b"INCR", times=1)
        ...                       # the INCR runs, its client sees ConnectionError
        assert proxy.lost == 1
"""

from __future__ import annotations

import contextlib
import hashlib
import random
import re
import select
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Self
from urllib.parse import urlsplit, urlunsplit

from crawler.frontier import protocol

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from types import TracebackType

__all__ = ["Command", "FaultProxy", "Loss", "Rule"]

Mode = Literal["drop", "hold", "outage", "pass"]

#: What to do with a reply: mode, hold seconds, outage seconds, the rule.
_Action = tuple[Mode, float, float | None, "Rule | None"]
#: Longest kept prefix of each recorded argument, in bytes.
_ARG_LIMIT = 256
#: Longest kept prefix of a lost reply, in bytes.
_REPLY_LIMIT = 4096
_CHUNK = 65536


@dataclass(frozen=True)
class Command:
    """One command a client sent through the proxy.

    :ivar conn: the proxy's number for the client connection (from 1).
    :ivar name: the command name, upper case (``b"EVALSHA"``).
    :ivar args: the arguments after the name, each cut to 256 bytes.
    :ivar at: :func:`time.monotonic` when the proxy read it.
    :ivar script: the SHA1 (hex) of the Lua script it runs (``EVALSHA``,
        ``EVAL``), else None.
    """

    conn: int
    name: bytes
    args: tuple[bytes, ...]
    at: float
    script: bytes | None = None


@dataclass(frozen=True)
class Loss:
    """A reply that Redis sent and the client never got.

    :ivar conn: the client connection.
    :ivar commands: what produced it: the command, or the whole
        ``MULTI`` ... ``EXEC`` transaction.
    :ivar reply: the reply bytes (cut to 4 KB).
    :ivar mode: ``"drop"`` or ``"hold"``.
    :ivar at: :func:`time.monotonic` when it was lost.
    """

    conn: int
    commands: tuple[Command, ...]
    reply: bytes
    mode: str
    at: float


@dataclass(eq=False)
class Rule:
    """Which replies to act on, and how: made by :meth:`FaultProxy.lose_replies`,
    :meth:`FaultProxy.outage_after` and :meth:`FaultProxy.after_reply`.

    :ivar remaining: matching replies still to act on.
    :ivar skip: matching replies to let through first.
    :ivar seen: matching replies so far (skipped ones included).
    :ivar acted: replies lost (or outages started) by this rule.
    """

    pattern: bytes | None
    command: bytes | None
    script: bytes | None
    reply: bytes | None
    remaining: int
    skip: int
    mode: Mode
    hold: float
    outage: float | None
    then: Callable[[], object] | None = None
    shas: set[bytes] = field(default_factory=set)
    seen: int = 0
    acted: int = 0

    def matches(self, name: bytes, args: list[bytes], raw: bytes) -> bool:
        """Whether the command (``name`` upper case) is one this rule targets."""
        if self.command is not None and name != self.command:
            return False
        if self.pattern is not None and self.pattern not in raw:
            return False
        if self.script is not None:
            if name == b"EVALSHA" and args:
                return args[0].lower() in self.shas
            if name == b"EVAL" and args:
                return self.script in named_source(args[0])
            return False
        return True


def named_source(source: bytes) -> bytes:
    """A loaded shard script's text with its keys by name again, as its files
    read (``KEYS[n]`` back to ``K.<name>``: the reverse of
    :func:`crawler.frontier.luasource.shard_source`), so that ``script=`` may
    be a script file's text. Other sources are returned as they are."""
    if b"\nlocal K = {}\n" not in source:
        return source
    names = {n: name.encode() for name, n in protocol.key_numbers().items()}
    return re.sub(rb"KEYS\[(\d+)\]", lambda m: b"K." + names[int(m.group(1))], source)


@dataclass
class _Slot:
    """One reply the connection waits for."""

    commands: tuple[Command, ...]
    rules: list[Rule] = field(default_factory=list)
    random_loss: bool = False


class _Conn:
    """One proxied client connection: two sockets, two pumping threads."""

    def __init__(self, number: int, client: socket.socket, upstream: socket.socket) -> None:
        self.number = number
        self.client = client
        self.upstream = upstream
        self.lock = threading.Lock()
        self.pending: deque[_Slot] = deque()
        self.in_multi = False
        self.tx_commands: list[Command] = []
        self.tx_rules: list[Rule] = []
        self.tx_random = False
        #: Set once a reply was lost: nothing more is forwarded either way.
        self.broken = False
        self.client_gone = threading.Event()
        self.closed = False
        self.threads: list[threading.Thread] = []

    def close(self) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
        for sock in (self.client, self.upstream):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()
        self.client_gone.set()


class FaultProxy:
    """A misbehaving TCP proxy in front of a real Redis server.

    :param upstream: the Redis server's URL (``redis://host:port/db``).
    :param host: the loopback address to listen on; the port is a free one.
    :param record: most commands kept for :meth:`commands` (the oldest go).
    """

    def __init__(self, upstream: str, *, host: str = "127.0.0.1", record: int = 200_000) -> None:
        parts = urlsplit(upstream)
        self._upstream_url = parts
        self._upstream = (parts.hostname or "127.0.0.1", parts.port or 6379)
        self._host = host
        self._port = 0
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._accept_thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._conns: dict[int, _Conn] = {}
        self._numbers = 0
        self._rules: list[Rule] = []
        self._random: tuple[random.Random, float, Mode, float] | None = None
        self._scripts: dict[bytes, bytes] = {}  # sha1 (hex, lower) -> source
        self._commands: deque[Command] = deque(maxlen=record)
        self._losses: list[Loss] = []
        self._in_outage = False
        self._outage_timer: threading.Timer | None = None
        self.outages = 0
        self.refused_during_outage = 0

    # -- life cycle ---------------------------------------------------------------

    def start(self) -> None:
        """Listen on a free loopback port and start accepting clients."""
        if self._accept_thread is not None:
            return
        self._stopping.clear()
        self._listen(0)
        self._accept_thread = threading.Thread(
            target=self._accept_loop, name=f"FaultProxy-{self._port}", daemon=True
        )
        self._accept_thread.start()

    def stop(self) -> None:
        """Stop accepting, cut every connection and join every thread."""
        self._stopping.set()
        if self._outage_timer is not None:
            self._outage_timer.cancel()
        with self._lock:
            listener, self._listener = self._listener, None
            conns = list(self._conns.values())
        if listener is not None:
            listener.close()
        for conn in conns:
            conn.close()
        if self._accept_thread is not None:
            self._accept_thread.join(timeout=5)
            self._accept_thread = None
        for conn in conns:
            for thread in conn.threads:
                thread.join(timeout=5)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        """The port the proxy listens on (kept across outages)."""
        return self._port

    @property
    def url(self) -> str:
        """The upstream URL with the proxy's address: what clients connect to."""
        netloc = f"{self._host}:{self._port}"
        if self._upstream_url.username or self._upstream_url.password:
            auth = self._upstream_url.netloc.rsplit("@", 1)[0]
            netloc = f"{auth}@{netloc}"
        return urlunsplit(self._upstream_url._replace(netloc=netloc))

    # -- faults -------------------------------------------------------------------

    def lose_replies(
        self,
        pattern: bytes | None = None,
        *,
        command: bytes | str | None = None,
        script: bytes | str | None = None,
        reply: bytes | None = None,
        times: int = 1,
        skip: int = 0,
        mode: Literal["drop", "hold"] = "drop",
        hold: float = 15.0,
    ) -> Rule:
        """Lose the replies to the next ``times`` matching commands.

        A command matches when every criterion given holds: ``pattern``
        occurs in the bytes the client sent for it, ``command`` is its name,
        ``script`` occurs in the source of the Lua script it runs
        (``EVALSHA`` of a script whose source the proxy knows, or ``EVAL``).
        With ``reply``, only replies containing those bytes count (a lease
        that leased something names its site, say); others pass. A
        ``NOSCRIPT`` error never counts: the script did not run.

        :param skip: let this many matching replies through first.
        :param mode: ``"drop"`` (close the connection at once) or ``"hold"``
            (keep the reply until the client has closed, or ``hold``
            seconds, then close).
        :returns: the rule, whose ``acted`` counts the replies it lost.
        """
        return self._add_rule(
            pattern, command, script, reply, times, skip, mode, hold=hold
        )

    def outage_after(
        self,
        pattern: bytes | None = None,
        *,
        command: bytes | str | None = None,
        script: bytes | str | None = None,
        reply: bytes | None = None,
        skip: int = 0,
        seconds: float | None = None,
    ) -> Rule:
        """Deliver the next matching reply (as :meth:`lose_replies` matches),
        then :meth:`begin_outage` for ``seconds`` (None: until
        :meth:`end_outage`)."""
        return self._add_rule(pattern, command, script, reply, 1, skip, "outage", outage=seconds)

    def after_reply(
        self,
        call: Callable[[], object],
        pattern: bytes | None = None,
        *,
        command: bytes | str | None = None,
        script: bytes | str | None = None,
        reply: bytes | None = None,
        skip: int = 0,
    ) -> Rule:
        """Deliver the next matching reply, then ``call()`` (on the proxy's
        thread): e.g. to kill the worker that just got it."""
        return self._add_rule(pattern, command, script, reply, 1, skip, "pass", then=call)

    def _add_rule(
        self,
        pattern: bytes | None,
        command: bytes | str | None,
        script: bytes | str | None,
        reply: bytes | None,
        times: int,
        skip: int,
        mode: Mode,
        *,
        hold: float = 15.0,
        outage: float | None = None,
        then: Callable[[], object] | None = None,
    ) -> Rule:
        if isinstance(command, str):
            command = command.encode()
        if isinstance(script, str):
            script = script.encode()
        rule = Rule(
            pattern=pattern,
            command=command.upper() if command is not None else None,
            script=script,
            reply=reply,
            remaining=times,
            skip=skip,
            mode=mode,
            hold=hold,
            outage=outage,
            then=then,
        )
        with self._lock:
            if script is not None:
                rule.shas.add(hashlib.sha1(script).hexdigest().encode())
                for sha, source in self._scripts.items():
                    if script in source:
                        rule.shas.add(sha)
            self._rules.append(rule)
        return rule

    def lose_randomly(
        self, one_in: float, *, seed: int, mode: Mode = "drop", hold: float = 15.0
    ) -> None:
        """Lose the reply to the last command of about one client write in
        ``one_in`` (inside a transaction: its ``EXEC``), chosen by a
        :class:`random.Random` seeded with ``seed``."""
        with self._lock:
            self._random = (random.Random(seed), 1.0 / one_in, mode, hold)

    def stop_losing(self) -> None:
        """Forget every rule and random loss: replies flow again."""
        with self._lock:
            self._rules.clear()
            self._random = None

    def learn_script(self, source: bytes | str) -> str:
        """Tell the proxy a script's source (as if loaded through it);
        returns its SHA1."""
        data = source.encode() if isinstance(source, str) else source
        sha = hashlib.sha1(data).hexdigest().encode()
        with self._lock:
            self._learn(sha, data)
        return sha.decode()

    def begin_outage(self, seconds: float | None = None) -> None:
        """Cut every connection and refuse new ones; Redis keeps running.

        :param seconds: end the outage after that long (None: at
            :meth:`end_outage`).
        """
        with self._lock:
            if self._in_outage:
                return
            self._in_outage = True
            self.outages += 1
            listener, self._listener = self._listener, None
            conns = list(self._conns.values())
        if listener is not None:
            listener.close()
        for conn in conns:
            conn.close()
        if seconds is not None:
            self._outage_timer = threading.Timer(seconds, self.end_outage)
            self._outage_timer.daemon = True
            self._outage_timer.start()

    def end_outage(self) -> None:
        """Accept connections again, on the same port."""
        with self._lock:
            if not self._in_outage or self._stopping.is_set():
                return
            self._in_outage = False
        self._listen(self._port)

    @contextlib.contextmanager
    def outage(self) -> Iterator[None]:
        """Redis unreachable for the ``with`` block."""
        self.begin_outage()
        try:
            yield
        finally:
            self.end_outage()

    @property
    def in_outage(self) -> bool:
        """Whether Redis is cut off now."""
        return self._in_outage

    def switch_upstream(self, upstream: str) -> None:
        """Send the connections opened from now on to ``upstream`` (a Redis
        URL), as a managed "primary endpoint" (a DNS name) does after a
        failover; those open now stay with the old server."""
        parts = urlsplit(upstream)
        with self._lock:
            self._upstream = (parts.hostname or "127.0.0.1", parts.port or 6379)

    def cut_connections(self) -> int:
        """Close every open connection (clients reconnect at once); returns
        how many were open."""
        with self._lock:
            conns = list(self._conns.values())
        for conn in conns:
            conn.close()
        return len(conns)

    # -- what happened ------------------------------------------------------------

    @property
    def lost(self) -> int:
        """How many replies were lost so far."""
        with self._lock:
            return len(self._losses)

    def losses(self) -> list[Loss]:
        """The replies lost so far, in order."""
        with self._lock:
            return list(self._losses)

    def commands(
        self, name: bytes | str | None = None, *, script: bytes | str | None = None
    ) -> list[Command]:
        """The commands seen so far, in order, optionally only those named
        ``name``, or those running the Lua script whose source contains
        ``script`` (``EVALSHA``/``EVAL``)."""
        if isinstance(name, str):
            name = name.encode()
        if isinstance(script, str):
            script = script.encode()
        with self._lock:
            seen = list(self._commands)
            shas = (
                {sha for sha, src in self._scripts.items() if script in src}
                if script is not None
                else set()
            )
        if script is not None:
            shas.add(hashlib.sha1(script).hexdigest().encode())
        return [
            cmd for cmd in seen
            if (name is None or cmd.name == name.upper())
            and (script is None or cmd.script in shas)
        ]

    def script_shas(self, script: bytes | str) -> set[str]:
        """SHA1s of the scripts seen whose source contains ``script``."""
        data = script.encode() if isinstance(script, str) else script
        with self._lock:
            return {sha.decode() for sha, src in self._scripts.items() if data in src}

    @property
    def connections(self) -> int:
        """Client connections open now."""
        with self._lock:
            return len(self._conns)

    # -- internals ------------------------------------------------------------------

    def _listen(self, port: int) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        deadline = time.monotonic() + 5
        while True:
            try:
                sock.bind((self._host, port))
                break
            except OSError:
                if not port or time.monotonic() > deadline:
                    sock.close()
                    raise
                self._stopping.wait(0.05)  # the port is still in use: try again
        sock.listen(128)
        sock.setblocking(False)
        with self._lock:
            self._port = sock.getsockname()[1]
            self._listener = sock

    def _accept_loop(self) -> None:
        while not self._stopping.is_set():
            listener = self._listener
            if listener is None:  # an outage: no listener until it ends
                self._stopping.wait(0.01)
                continue
            try:
                ready, _, _ = select.select([listener], [], [], 0.05)
                if not ready:
                    continue
                client, _ = listener.accept()
            except (OSError, ValueError):
                continue  # closed for an outage or at stop
            client.setblocking(True)
            try:
                with self._lock:
                    target = self._upstream
                upstream = socket.create_connection(target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                if self._in_outage or self._stopping.is_set():
                    self.refused_during_outage += 1
                    client.close()
                    upstream.close()
                    continue
                self._numbers += 1
                conn = _Conn(self._numbers, client, upstream)
                self._conns[conn.number] = conn
            for target, name in ((self._pump_requests, "req"), (self._pump_replies, "rep")):
                thread = threading.Thread(
                    target=target, args=(conn,), name=f"FaultProxy-{conn.number}-{name}",
                    daemon=True,
                )
                conn.threads.append(thread)
                thread.start()

    def _forget(self, conn: _Conn) -> None:
        conn.close()
        with self._lock:
            self._conns.pop(conn.number, None)

    def _learn(self, sha: bytes, source: bytes) -> None:
        """Record a script's source (lock held), as its files read
        (:func:`named_source`)."""
        source = named_source(source)
        self._scripts[sha] = source
        for rule in self._rules:
            if rule.script is not None and rule.script in source:
                rule.shas.add(sha)

    def _pump_requests(self, conn: _Conn) -> None:
        """Client -> Redis: note each complete command, then forward the bytes."""
        buf = bytearray()
        try:
            while True:
                data = conn.client.recv(_CHUNK)
                if not data:
                    break
                buf += data
                parsed, used = _parse_requests(buf)
                del buf[:used]
                with conn.lock:
                    if conn.broken:
                        continue  # a reply was lost: nothing more runs here
                    self._note(conn, parsed)
                conn.upstream.sendall(data)
        except OSError:
            pass
        finally:
            conn.client_gone.set()
            with conn.lock:
                broken = conn.broken
            if not broken:
                self._forget(conn)

    def _note(self, conn: _Conn, parsed: list[tuple[list[bytes], bytes]]) -> None:
        """Queue one expected reply per command (conn.lock held)."""
        now = time.monotonic()
        last: _Slot | None = None
        with self._lock:
            for args, raw in parsed:
                if not args:
                    continue
                cmd = self._record(conn, args, now)
                name, rest = cmd.name, args[1:]
                rules = [r for r in self._rules if r.remaining > 0 and r.matches(name, rest, raw)]
                if name == b"MULTI":
                    conn.in_multi = True
                    conn.tx_commands, conn.tx_rules, conn.tx_random = [cmd], rules, False
                    slot = _Slot((cmd,))
                elif name in (b"EXEC", b"DISCARD") and conn.in_multi:
                    conn.in_multi = False
                    slot = _Slot(
                        (*conn.tx_commands, cmd),
                        conn.tx_rules + rules if name == b"EXEC" else [],
                        conn.tx_random and name == b"EXEC",
                    )
                    conn.tx_commands, conn.tx_rules, conn.tx_random = [], [], False
                elif conn.in_multi:
                    conn.tx_commands.append(cmd)
                    conn.tx_rules += rules
                    slot = _Slot((cmd,))
                else:
                    slot = _Slot((cmd,), rules)
                conn.pending.append(slot)
                last = slot
            if last is not None and self._random is not None:
                rng, chance, _, _ = self._random
                if rng.random() < chance:
                    if conn.in_multi:
                        conn.tx_random = True
                    else:
                        last.random_loss = True

    def _record(self, conn: _Conn, args: list[bytes], now: float) -> Command:
        """Log a command, learning the scripts it loads (lock held)."""
        name, rest = args[0].upper(), args[1:]
        sha = None
        if name == b"SCRIPT" and len(rest) >= 2 and rest[0].upper() == b"LOAD":
            self._learn(hashlib.sha1(rest[1]).hexdigest().encode(), rest[1])
        elif name == b"EVAL" and rest:
            sha = hashlib.sha1(rest[0]).hexdigest().encode()
            self._learn(sha, rest[0])
        elif name == b"EVALSHA" and rest:
            sha = rest[0].lower()
        cmd = Command(conn.number, name, tuple(a[:_ARG_LIMIT] for a in rest), now, sha)
        self._commands.append(cmd)
        return cmd

    def _pump_replies(self, conn: _Conn) -> None:
        """Redis -> client: forward whole replies, losing the chosen ones."""
        buf = bytearray()
        try:
            while True:
                data = conn.upstream.recv(_CHUNK)
                if not data:
                    break
                buf += data
                pos = 0
                out = bytearray()
                while True:
                    end = _reply_end(buf, pos)
                    if end is None:
                        break
                    reply = bytes(buf[pos:end])
                    counts = buf[pos] not in b">|"  # push messages, attributes
                    pos = end
                    if not counts:
                        out += reply
                        continue
                    with conn.lock:
                        slot = conn.pending.popleft() if conn.pending else None
                    action = self._decide(slot, reply) if slot is not None else None
                    if action is None:
                        out += reply
                        continue
                    mode, hold, outage, rule = action
                    then = rule.then if rule is not None else None
                    if mode == "pass":
                        out += reply
                        conn.client.sendall(out)
                        out = bytearray()
                        if then is not None:
                            then()
                        continue
                    if mode == "outage":
                        out += reply
                        conn.client.sendall(out)
                        self.begin_outage(outage)
                        return
                    conn.client.sendall(out)
                    assert slot is not None
                    self._lose(conn, slot, reply, mode, hold)
                    return
                del buf[:pos]
                if out:
                    conn.client.sendall(out)
        except OSError:
            pass
        finally:
            self._forget(conn)

    def _decide(self, slot: _Slot, reply: bytes) -> _Action | None:
        """Whether to lose this reply, and how (consumes the rule)."""
        with self._lock:
            # NOSCRIPT: the script did not run (the client loads it and
            # sends the call again, which is the one to lose).
            rules = [] if reply.startswith(b"-NOSCRIPT") else slot.rules
            for rule in rules:
                if rule.remaining <= 0:
                    continue
                if rule.reply is not None and rule.reply not in reply:
                    continue
                rule.seen += 1
                if rule.seen <= rule.skip:
                    continue
                rule.remaining -= 1
                rule.acted += 1
                return rule.mode, rule.hold, rule.outage, rule
            if slot.random_loss and self._random is not None:
                _, _, mode, hold = self._random
                return mode, hold, None, None
        return None

    def _lose(self, conn: _Conn, slot: _Slot, reply: bytes, mode: Mode, hold: float) -> None:
        with conn.lock:
            conn.broken = True
        with self._lock:
            self._losses.append(
                Loss(conn.number, slot.commands, reply[:_REPLY_LIMIT], mode, time.monotonic())
            )
        if mode == "hold":
            # The client times out and closes (or the hold ends): then close.
            conn.client_gone.wait(hold)


def _parse_requests(buf: bytearray) -> tuple[list[tuple[list[bytes], bytes]], int]:
    """Complete commands at the start of ``buf``: ``([(args, raw)], bytes used)``."""
    out: list[tuple[list[bytes], bytes]] = []
    pos = 0
    while pos < len(buf):
        parsed = _parse_request(buf, pos)
        if parsed is None:
            break
        args, end = parsed
        out.append((args, bytes(buf[pos:end])))
        pos = end
    return out, pos


def _parse_request(buf: bytearray, pos: int) -> tuple[list[bytes], int] | None:
    """One command at ``pos`` (a RESP array of bulk strings, or an inline
    command): ``(args, end)``, or None when incomplete."""
    line_end = buf.find(b"\r\n", pos)
    if buf[pos : pos + 1] != b"*":
        nl = buf.find(b"\n", pos)
        if nl < 0:
            return None
        return [bytes(a) for a in bytes(buf[pos:nl]).split()], nl + 1
    if line_end < 0:
        return None
    count = int(buf[pos + 1 : line_end])
    p = line_end + 2
    args = []
    for _ in range(max(0, count)):
        head_end = buf.find(b"\r\n", p)
        if head_end < 0:
            return None
        size = int(buf[p + 1 : head_end])
        start = head_end + 2
        if len(buf) < start + size + 2:
            return None
        args.append(bytes(buf[start : start + size]))
        p = start + size + 2
    return args, p


def _reply_end(buf: bytearray, pos: int) -> int | None:
    """End offset of the RESP2/RESP3 reply at ``pos``, or None when incomplete."""
    line_end = buf.find(b"\r\n", pos)
    if line_end < 0:
        return None
    kind = buf[pos : pos + 1]
    after = line_end + 2
    if kind in (b"+", b"-", b":", b"_", b",", b"#", b"("):  # one line
        return after
    if kind not in (b"$", b"!", b"=", b"*", b"~", b">", b"%", b"|"):
        raise ValueError(f"not a RESP reply: {bytes(buf[pos : pos + 40])!r}")
    size = int(buf[pos + 1 : line_end])
    end: int | None = after
    if size < 0:  # null bulk string or array
        pass
    elif kind in (b"$", b"!", b"="):  # bulk: size bytes and CRLF
        end = after + size + 2 if len(buf) >= after + size + 2 else None
    else:  # aggregates: size elements (maps and attributes: size pairs)
        for _ in range(size * 2 if kind in (b"%", b"|") else size):
            end = _reply_end(buf, end) if end is not None else None
    return end


