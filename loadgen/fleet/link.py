"""The link to an MQTT broker: where it is, who we are, and staying connected.

`--broker mqtt://user@host:1883` (or `mqtts://…`, TLS, port 8883 by default)
says where; the password never goes on the command line or in the URL (it
would sit in shell history and `ps`): the command line reads it from
$TOKENTOP_MQTT_PASSWORD or `--mqtt-password-file` and hands it to
`BrokerSettings.from_url`. `BrokerSettings` never shows it (repr, str,
`display`), so it cannot reach a log line or a payload by accident.

`MqttLink.run(session)` is the reconnect loop around `aiomqtt.Client`: connect,
run `session(client)` for as long as the connection lives, and when the
broker goes away (or refuses us) wait with exponential backoff and jitter, and
connect again — until `close()`. Whoever uses it keeps working while it is
down (the publisher holds a backlog); nothing here ever raises to the caller
because the broker is unreachable. The backoff starts at `min_backoff`, doubles
up to `max_backoff`, and starts over after every successful connect, so a
broker that restarts is back in use within about `max_backoff` seconds.

The first attempt's outcome is kept (`first_attempt`, `refused_at_start`): a
broker that answers the very first CONNACK with "bad user name or password" /
"not authorized" is a configuration error the caller may refuse to run with,
where a broker that is not there at all (or refuses us later) is an outage.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import re
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

if TYPE_CHECKING:
    import aiomqtt

# aiomqtt and paho are imported where a connection is made, not here: every command line
# reads the defaults and BrokerSettings below, and most runs never publish (they cost ~0.1 s
# of CPU at start-up)

log = logging.getLogger("tokentop.mqtt")

PASSWORD_ENV = "TOKENTOP_MQTT_PASSWORD"
DEFAULT_FLEET = "default"
DEFAULT_KEEPALIVE = 30
TOPIC_ROOT = "tokentop"
_LEVEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class BrokerError(ValueError):
    """A broker setting that cannot be used; str(e) is the message for the user."""


@dataclass
class BrokerSettings:
    host: str
    port: int
    tls: bool = False
    username: str | None = None
    password: str | None = field(default=None, repr=False)  # never printed
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    keepalive: int = DEFAULT_KEEPALIVE

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        password: str | None = None,
        ca_file: str | None = None,
        cert_file: str | None = None,
        key_file: str | None = None,
        keepalive: int = DEFAULT_KEEPALIVE,
    ) -> BrokerSettings:
        """Everything about one broker, checked now: a bad setting (or an unreadable CA or
        certificate) is a BrokerError in words at start, not a retry loop later.

        The password is given, never looked up here: where it comes from (a file, the
        environment) is the caller's business, so this stays a plain function of values.
        """
        settings = parse_broker_url(url)
        if password is not None and settings.username is None:
            raise BrokerError("a broker password is set but no user: use mqtt://USER@host:port")
        if (ca_file or cert_file) and not settings.tls:
            raise BrokerError("--mqtt-ca-file / --mqtt-cert-file need an mqtts:// broker")
        if not 1 <= keepalive <= 65535:
            raise BrokerError("--mqtt-keepalive must be between 1 and 65535 seconds")
        settings.password = password
        settings.ca_file, settings.cert_file, settings.key_file = ca_file, cert_file, key_file
        settings.keepalive = keepalive
        settings.tls_context()
        return settings

    @property
    def display(self) -> str:
        """The broker as the user may see it: scheme, user, host, port; never the password."""
        user = f"{self.username}@" if self.username else ""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'mqtts' if self.tls else 'mqtt'}://{user}{host}:{self.port}"

    def __str__(self) -> str:
        return self.display

    def tls_context(self) -> ssl.SSLContext | None:
        if not self.tls:
            return None
        try:
            ctx = ssl.create_default_context(cafile=self.ca_file)
            if self.cert_file:
                ctx.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as e:
            raise BrokerError(f"cannot set up TLS for {self.display}: {e}") from None
        return ctx


def parse_broker_url(url: str) -> BrokerSettings:
    """mqtt://[user@]host[:port] or mqtts://[user@]host[:port]; a password in the URL is refused."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("mqtt", "mqtts", "tcp", "ssl"):
        raise BrokerError(f"bad broker {url!r}: use mqtt://host:1883 or mqtts://host:8883")
    tls = parts.scheme in ("mqtts", "ssl")
    if parts.password is not None:
        raise BrokerError(
            f"do not put the broker password in the URL (it ends up in shell history and "
            f"`ps`): set ${PASSWORD_ENV} or use --mqtt-password-file"
        )
    try:
        port = parts.port or (8883 if tls else 1883)
    except ValueError:
        raise BrokerError(f"bad port in broker {url!r}") from None
    if not parts.hostname:
        raise BrokerError(f"bad broker {url!r}: no host name")
    if parts.path not in ("", "/"):
        raise BrokerError(f"bad broker {url!r}: no path expected after host:port")
    user = unquote(parts.username) if parts.username else None
    return BrokerSettings(host=parts.hostname, port=port, tls=tls, username=user)


def is_level(name: str) -> bool:
    """Whether `name` may be a fleet's or an agent's name (check_level's rule)."""
    return bool(_LEVEL.match(name)) and name != "all"


def check_level(kind: str, name: str) -> str:
    """A fleet or agent name is one MQTT topic level: letters, digits, . _ -, at most 64."""
    if not is_level(name):
        raise BrokerError(
            f"bad {kind} name {name!r}: use letters, digits, '.', '_' or '-' (at most 64, "
            "not 'all'), e.g. gpu-07"
        )
    return name


def topic(fleet: str, agent: str, kind: str) -> str:
    """tokentop/<fleet>/<agent>/<kind>: snapshot | events | status | control | control/reply."""
    return f"{TOPIC_ROOT}/{fleet}/{agent}/{kind}"


# ---- the reconnect loop ---------------------------------------------------------------------

Session = Callable[["aiomqtt.Client"], Awaitable[None]]


def describe_error(e: BaseException, settings: BrokerSettings) -> str:
    """A broker failure in words (never with the password, which no error text holds)."""
    text = str(e) or type(e).__name__
    low = text.lower()
    if "not authori" in low or "bad user name or password" in low or "code:5" in low \
            or "code:4" in low:
        who = f"user {settings.username!r}" if settings.username else "anonymous clients"
        return (f"{settings.display} refused {who}: not authorized (check the user and "
                f"${PASSWORD_ENV} / --mqtt-password-file)")
    if "refused" in low or "errno 111" in low:
        return f"cannot connect to {settings.display}: connection refused"
    return f"{settings.display}: {text}"


# CONNACK reason codes that refuse the credentials: 4 / 5 in MQTT 3.1.1, 134 / 135 in v5
AUTH_REFUSED = frozenset({4, 5, 134, 135})


def refused_credentials(e: BaseException) -> bool:
    """Did the broker answer and refuse who we are (rather than not answer at all)?"""
    import aiomqtt  # loaded already: `e` came from it

    if not isinstance(e, aiomqtt.MqttCodeError):
        return False
    rc = getattr(e.rc, "value", e.rc)  # paho's ReasonCode, or a 3.1.1 int
    return isinstance(rc, int) and rc in AUTH_REFUSED


class MqttLink:
    """Stay connected to one broker and run a session on every connection.

    `will` is registered on every connect. `persistent=True` asks the broker to
    keep our session (subscriptions and queued QoS 1 messages) for
    `session_expiry` seconds across reconnects (MQTT v5 clean start off after
    the first connect), so nothing sent at QoS 1 while we were away is lost.
    """

    def __init__(
        self,
        settings: BrokerSettings,
        *,
        identifier: str,
        will: aiomqtt.Will | None = None,
        persistent: bool = False,
        session_expiry: int = 300,
        min_backoff: float = 0.5,
        max_backoff: float = 30.0,
        on_state: Callable[[str, str | None], None] | None = None,
    ) -> None:
        self.settings = settings
        self.identifier = identifier
        self.will = will
        self.persistent = persistent
        self.session_expiry = session_expiry
        self.min_backoff, self.max_backoff = min_backoff, max_backoff
        self.on_state = on_state
        self.connected = asyncio.Event()
        self.client: aiomqtt.Client | None = None
        self.last_error: str | None = None
        self.connects = 0  # successful connections so far
        self.first_attempt = asyncio.Event()  # set once the first connect has an outcome
        self.refused_at_start = False  # the broker refused the credentials on that attempt
        self._closing = False
        self._said: str | None = None
        self._sleep: asyncio.Task | None = None

    def _client(self) -> aiomqtt.Client:
        import aiomqtt  # here, not at the top: see the imports
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        props = None
        if self.persistent:
            props = Properties(PacketTypes.CONNECT)
            props.SessionExpiryInterval = self.session_expiry
        s = self.settings
        return aiomqtt.Client(
            s.host,
            s.port,
            username=s.username,
            password=s.password,
            identifier=self.identifier,
            protocol=aiomqtt.ProtocolVersion.V5,
            will=self.will,
            keepalive=s.keepalive,
            clean_start=not (self.persistent and self.connects > 0),
            properties=props,
            tls_context=s.tls_context(),
            timeout=10,
            logger=logging.getLogger("tokentop.mqtt.paho"),
        )

    async def run(self, session: Session) -> None:
        """Connect and run `session` until `close()`; reconnect with backoff on any loss."""
        import aiomqtt  # here, not at the top: see the imports

        backoff = self.min_backoff
        while not self._closing:
            connected_at: float | None = None
            quiet = False
            try:
                async with self._client() as client:
                    connected_at = time.monotonic()
                    self.client = client
                    self.connects += 1
                    self.last_error = None
                    self.connected.set()
                    self.first_attempt.set()
                    self._state("connected", None)
                    await session(client)
                    if self._closing:
                        return
            except (aiomqtt.MqttError, OSError) as e:  # OSError: DNS, TLS handshake and the like
                self.last_error = describe_error(e, self.settings)
                if not self.first_attempt.is_set() and refused_credentials(e):
                    # the caller decides (see `refused_at_start`); a retry says it
                    self.refused_at_start = quiet = True
            finally:
                self.client = None
                if self.connected.is_set():
                    self.connected.clear()
                self.first_attempt.set()
            if self._closing:
                return
            self._state("disconnected", self.last_error, quiet=quiet)
            if connected_at is not None and time.monotonic() - connected_at > 1.0:
                backoff = self.min_backoff  # it had been connected: start over, retry soon
            delay = backoff * random.uniform(0.8, 1.2)
            backoff = min(self.max_backoff, backoff * 2)
            self._sleep = asyncio.ensure_future(asyncio.sleep(delay))
            with contextlib.suppress(asyncio.CancelledError):
                await self._sleep
            self._sleep = None

    async def first_outcome(self, timeout: float) -> bool:
        """Wait (at most `timeout` s) for the first connect attempt to end either way;
        False if it is still going (a broker that does not answer)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.first_attempt.wait(), timeout)
        return self.first_attempt.is_set()

    def _state(self, state: str, error: str | None, *, quiet: bool = False) -> None:
        if error and quiet:
            log.debug("%s", error)
        elif error:
            # the same failure on every retry is said once
            (log.warning if error != self._said else log.debug)("%s; retrying", error)
            self._said = error
        else:
            self._said = None
            log.info("%s %s", state, self.settings.display)
        if self.on_state is not None:
            self.on_state(state, error)

    def stop_retrying(self) -> None:
        """No more reconnects: `run` returns after the current session (or backoff) ends."""
        self._closing = True
        if self._sleep is not None:
            self._sleep.cancel()
