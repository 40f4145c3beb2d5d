"""Where a machine learns it is about to be taken back: its metadata service.

One ``NoticeSource`` a cloud, each asked with ``poll()`` (one or two small HTTP
calls, never through a proxy) and answering ``None`` or a ``Notice`` - when the
machine goes, in epoch seconds:

- ``AwsSpotNotices``: EC2 spot's ``latest/meta-data/spot/instance-action``
  (``{"action": "terminate", "time": "2026-01-05T18:02:00Z"}``; 404 while there is
  none), with an IMDSv2 token (a PUT of ``latest/api/token`` with
  ``X-aws-ec2-metadata-token-ttl-seconds``, kept until shortly before it expires; a
  metadata service that does not issue tokens is asked without, as botocore does).
  The endpoint is botocore's: ``AWS_EC2_METADATA_SERVICE_ENDPOINT`` (or
  ``ec2_metadata_service_endpoint`` in the config file), else the IPv6 address when
  the endpoint mode is IPv6, else http://169.254.169.254.
- ``AzureScheduledEvents``: ``metadata/scheduledevents`` (``Metadata: true``,
  ``api-version`` 2020-07-01): a ``Preempt`` (spot eviction) or ``Terminate`` event
  naming this VM (its ``compute/name``) among its ``Resources``; ``NotBefore`` is
  when (empty once started: now). ``acknowledge()`` posts ``StartRequests`` for the
  event once the worker has drained, so Azure goes ahead without waiting out the
  notice.
- ``AlibabaSpotNotices``: Alibaba Cloud ECS spot's
  ``latest/meta-data/instance/spot/termination-time`` at http://100.100.100.200 (the
  time as text; 404 while there is none), with a token in security-hardened mode
  (``X-aliyun-ecs-metadata-token``), or without where the instance takes none.

Every endpoint is a constructor argument (tests point them at a local server). A
failure to ask raises ``NoticeError``; the watch (``fleet.interruption``) logs it and
asks again.
"""

from __future__ import annotations

import email.utils
import json
import os
from datetime import datetime, timezone
from typing import Any, ClassVar, NamedTuple, Protocol, runtime_checkable

from leasekeeper.clock import SYSTEM_CLOCK, Clock
from leasekeeper.fleet._http import Answer, call, join

__all__ = [
    "SOURCES",
    "AlibabaSpotNotices",
    "AwsSpotNotices",
    "AzureScheduledEvents",
    "Notice",
    "NoticeError",
    "NoticeSource",
    "aws_metadata_endpoint",
    "notice_source",
]

AWS_DEFAULT = "http://169.254.169.254"
AWS_IPV6 = "http://[fd00:ec2::254]"
AZURE_DEFAULT = "http://169.254.169.254"
ALIBABA_DEFAULT = "http://100.100.100.200"
#: A token's life, asked for (the most both services give: six hours).
TOKEN_TTL = 21600


class Notice(NamedTuple):
    """The machine goes at ``at`` (epoch seconds); ``what`` says who said so;
    ``event_id``: what to acknowledge (Azure), else None."""

    at: float
    what: str
    event_id: str | None = None


class NoticeError(Exception):
    """The metadata service could not be asked, or answered what it should not."""


@runtime_checkable
class NoticeSource(Protocol):
    """Asks a machine's metadata service whether the machine is about to go."""

    name: str

    def poll(self) -> Notice | None:
        """The notice, or None while there is none; ``NoticeError`` when asking failed."""
        ...

    def acknowledge(self, notice: Notice) -> None:
        """The worker has drained: let the cloud go ahead (where it waits to be told)."""
        ...


def parse_iso(text: str) -> float:
    """``2026-01-05T18:02:00Z`` (UTC unless it says otherwise) as epoch seconds."""
    value = text.strip()
    if value.endswith(("Z", "z")):
        value = value[:-1] + "+00:00"
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise NoticeError(f"not a time: {text[:60]!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


def _answer(method: str, url: str, timeout: float, **options: Any) -> Answer:
    try:
        return call(method, url, timeout=timeout, **options)
    except Exception as exc:  # refused, reset, timed out, malformed
        raise NoticeError(f"{method} {url}: {type(exc).__name__}: {exc}") from None


class _TokenService:
    """A metadata service that takes a session token (IMDSv2's way; Alibaba's
    security-hardened mode): one PUT for a token, kept until a minute before it
    expires; where the service issues none (403, 404, 405), the calls go without."""

    TTL_HEADER = ""
    TOKEN_HEADER = ""

    def __init__(self, endpoint: str, timeout: float, clock: Clock) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self.clock = clock
        self._token: str | None = None
        self._token_until = -1.0

    def _headers(self) -> dict[str, str]:
        now = self.clock.now()
        if self._token is None or now >= self._token_until:
            answer = _answer(
                "PUT",
                join(self.endpoint, "latest/api/token"),
                self.timeout,
                headers={self.TTL_HEADER: str(TOKEN_TTL)},
            )
            if answer.status in (403, 404, 405):
                self._token = None  # no tokens here: ask without (as botocore does)
                self._token_until = now + 300.0
                return {}
            if answer.status != 200 or not answer.text:
                raise NoticeError(f"the token PUT answered HTTP {answer.status}")
            self._token, self._token_until = answer.text, now + TOKEN_TTL - 60.0
        return {} if self._token is None else {self.TOKEN_HEADER: self._token}

    def _get(self, path: str) -> Answer:
        """GET ``path`` with the token; a token refused (401) is fetched once more."""
        url = join(self.endpoint, path)
        answer = _answer("GET", url, self.timeout, headers=self._headers())
        if answer.status == 401:
            self._token = None
            self._token_until = -1.0
            answer = _answer("GET", url, self.timeout, headers=self._headers())
        return answer

    def acknowledge(self, notice: Notice) -> None:
        """Nothing to tell: the machine goes at its time."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.endpoint!r})"


def aws_metadata_endpoint() -> str:
    """The EC2 metadata service, as botocore finds it: ``ec2_metadata_service_endpoint``
    (``AWS_EC2_METADATA_SERVICE_ENDPOINT``, or the shared config file), else the IPv6
    address when ``ec2_metadata_service_endpoint_mode`` is IPv6, else the IPv4 one."""
    endpoint = os.environ.get("AWS_EC2_METADATA_SERVICE_ENDPOINT") or None
    mode = os.environ.get("AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE") or None
    try:  # the config file too, where botocore is installed
        import botocore.session

        session = botocore.session.Session()
        endpoint = session.get_config_variable("ec2_metadata_service_endpoint") or endpoint
        mode = session.get_config_variable("ec2_metadata_service_endpoint_mode") or mode
    except Exception:  # no botocore, or a config file it cannot read: the environment's
        pass
    if endpoint:
        return str(endpoint)
    if str(mode or "").lower() == "ipv6":
        return AWS_IPV6
    return AWS_DEFAULT


class AwsSpotNotices(_TokenService):
    """EC2 spot interruption notices (see the module docstring). ``endpoint`` None:
    ``aws_metadata_endpoint()``."""

    name = "aws"
    TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
    TOKEN_HEADER = "X-aws-ec2-metadata-token"
    PATH = "latest/meta-data/spot/instance-action"

    def __init__(
        self, endpoint: str | None = None, *, timeout: float = 2.0, clock: Clock | None = None
    ) -> None:
        super().__init__(
            aws_metadata_endpoint() if endpoint is None else endpoint,
            timeout,
            SYSTEM_CLOCK if clock is None else clock,
        )

    def poll(self) -> Notice | None:
        answer = self._get(self.PATH)
        if answer.status == 404:
            return None
        if answer.status != 200:
            raise NoticeError(f"instance-action answered HTTP {answer.status}")
        try:
            data = json.loads(answer.body)
            action, when = str(data["action"]), str(data["time"])
        except (ValueError, KeyError, TypeError):
            text = f"instance-action is not as documented: {answer.text[:80]!r}"
            raise NoticeError(text) from None
        return Notice(parse_iso(when), f"AWS spot instance-action {action} at {when}")


class AlibabaSpotNotices(_TokenService):
    """Alibaba Cloud ECS spot (preemptible) instance notices (see the module
    docstring)."""

    name = "alibaba"
    TTL_HEADER = "X-aliyun-ecs-metadata-token-ttl-seconds"
    TOKEN_HEADER = "X-aliyun-ecs-metadata-token"
    PATH = "latest/meta-data/instance/spot/termination-time"

    def __init__(
        self, endpoint: str = ALIBABA_DEFAULT, *, timeout: float = 2.0, clock: Clock | None = None
    ) -> None:
        super().__init__(endpoint, timeout, SYSTEM_CLOCK if clock is None else clock)

    def poll(self) -> Notice | None:
        answer = self._get(self.PATH)
        if answer.status == 404:
            return None
        if answer.status != 200:
            raise NoticeError(f"spot/termination-time answered HTTP {answer.status}")
        when = answer.text
        return Notice(parse_iso(when), f"Alibaba Cloud spot termination-time {when}")


class AzureScheduledEvents:
    """Azure Scheduled Events: ``Preempt`` and ``Terminate`` (see the module
    docstring). The first call after a VM starts may take up to two minutes (Azure
    enables the service then): it gets ``first_timeout``."""

    name = "azure"
    API_VERSION = "2020-07-01"
    KINDS = frozenset({"Preempt", "Terminate"})
    HEADERS: ClassVar[dict[str, str]] = {"Metadata": "true"}

    def __init__(
        self,
        endpoint: str = AZURE_DEFAULT,
        *,
        timeout: float = 2.0,
        first_timeout: float = 120.0,
        clock: Clock | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self.first_timeout = first_timeout
        self.clock = SYSTEM_CLOCK if clock is None else clock
        self.url = join(endpoint, f"metadata/scheduledevents?api-version={self.API_VERSION}")
        self._asked = False
        self._vm: str | None = None
        self._vm_known = False

    def vm_name(self) -> str | None:
        """This VM's name (``compute/name``), as events name it among their
        ``Resources``; None when it cannot be read (then every event counts)."""
        if not self._vm_known:
            url = join(self.endpoint, "metadata/instance/compute/name")
            try:
                answer = _answer(
                    "GET",
                    url + "?api-version=2021-02-01&format=text",
                    self.timeout,
                    headers=self.HEADERS,
                )
            except NoticeError:
                return None  # asked again at the next event
            self._vm_known = True
            self._vm = answer.text if answer.status == 200 and answer.text else None
        return self._vm

    def poll(self) -> Notice | None:
        timeout = self.timeout if self._asked else self.first_timeout
        answer = _answer("GET", self.url, timeout, headers=self.HEADERS)
        self._asked = True
        if answer.status != 200:
            raise NoticeError(f"scheduledevents answered HTTP {answer.status}")
        try:
            events = json.loads(answer.body)["Events"]
        except (ValueError, KeyError, TypeError):
            text = f"scheduledevents is not as documented: {answer.text[:80]!r}"
            raise NoticeError(text) from None
        found: list[Notice] = []
        for event in events if isinstance(events, list) else []:
            if not isinstance(event, dict) or event.get("EventType") not in self.KINDS:
                continue
            resources = event.get("Resources") or []
            vm = self.vm_name() if resources else None
            if vm is not None and vm not in resources:
                continue  # another VM's (of the same availability set or scale set)
            when = str(event.get("NotBefore") or "")
            at = self._when(when)
            what = f"Azure {event.get('EventType')} not before {when or 'now'}"
            found.append(Notice(at, what, str(event.get("EventId"))))
        return min(found, default=None)

    def _when(self, text: str) -> float:
        """``NotBefore`` (``Mon, 19 Sep 2016 18:29:47 GMT``) as epoch seconds; now
        when it is empty (the event has started)."""
        if not text.strip():
            return self.clock.wall()
        try:
            return email.utils.parsedate_to_datetime(text).timestamp()
        except (TypeError, ValueError):
            raise NoticeError(f"NotBefore is not a date: {text[:60]!r}") from None

    def acknowledge(self, notice: Notice) -> None:
        """Approve the event (``StartRequests``): the worker has drained."""
        if notice.event_id is None:
            return
        body = json.dumps({"StartRequests": [{"EventId": notice.event_id}]}).encode()
        answer = _answer(
            "POST",
            self.url,
            self.timeout,
            headers={**self.HEADERS, "Content-Type": "application/json"},
            body=body,
        )
        if answer.status != 200:
            raise NoticeError(f"StartRequests answered HTTP {answer.status}")

    def __repr__(self) -> str:
        return f"AzureScheduledEvents({self.endpoint!r})"


#: The sources by the name ``--interruption-notice`` takes.
SOURCES: dict[str, type[AwsSpotNotices] | type[AzureScheduledEvents] | type[AlibabaSpotNotices]] = {
    "aws": AwsSpotNotices,
    "azure": AzureScheduledEvents,
    "alibaba": AlibabaSpotNotices,
}


def notice_source(
    name: str, endpoint: str | None = None, *, clock: Clock | None = None
) -> NoticeSource:
    """The source ``name`` (aws, azure, alibaba) names, at ``endpoint`` (None: the
    cloud's own)."""
    kind = SOURCES.get(name)
    if kind is None:
        raise ValueError(f"interruption_notice must be one of {', '.join(SOURCES)}, got {name!r}")
    if endpoint is None:
        return kind(clock=clock)
    return kind(endpoint, clock=clock)
