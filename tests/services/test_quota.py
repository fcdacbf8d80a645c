"""Per-tenant quotas (services/common/rules/quota.py): the token bucket with hand-made times, open streams
freed however a stream ends, the [limits] fields, the RetryInfo status and the HTTP Retry-After."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
from google.rpc import error_details_pb2

from lookahead_rag.services.common.errors import InvalidArgument, ResourceExhausted, retry_after_of, retry_status
from lookahead_rag.services.common.rules import quota as quota_module
from lookahead_rag.services.common.rules.limits import RequestLimits
from lookahead_rag.services.common.rules.quota import Quota, TenantQuotas, TokenBucket
from lookahead_rag.services.common.settings import ConfigError, load_settings
from lookahead_rag.services.http.errors import error_response, retry_after_header


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def quotas(rps: float = 0.0, burst: float = 0.0, streams: int = 0, clock: FakeClock | None = None,
           **overrides: Quota) -> TenantQuotas:
    return TenantQuotas(Quota(rps, burst, streams), overrides, stream_retry_s=1.5, clock=clock or FakeClock())


def clocked(rps: float, burst: float = 0.0, streams: int = 0) -> tuple[TenantQuotas, FakeClock]:
    """Quotas and the clock they read, for a test that moves time."""
    clock = FakeClock()
    return quotas(rps, burst, streams, clock), clock


def let_through(q: TenantQuotas, times: int, tenant: str = "acme") -> None:
    """``times`` requests in a row that the rate must let through."""
    for _ in range(times):
        q.check_rate(tenant)


def refusal(q: TenantQuotas, tenant: str = "acme") -> ResourceExhausted:
    with pytest.raises(ResourceExhausted) as info:
        q.check_rate(tenant)
    return info.value


# ---- the token bucket ------------------------------------------------------------------------------
def test_burst_then_one_request_per_interval() -> None:
    # rps 2, burst 3: three at once, then one every 0.5 s; a refusal says how long to wait
    q, clock = clocked(rps=2, burst=3)
    let_through(q, 3)
    assert refusal(q).retry_after_s == pytest.approx(0.5)
    clock.now += 0.5
    q.check_rate("acme")
    assert refusal(q).retry_after_s == pytest.approx(0.5)


def test_a_refusal_takes_nothing() -> None:
    # refused requests do not dig a hole: the wait shrinks with time, never grows with retries
    q, clock = clocked(rps=1, burst=1)
    q.check_rate("acme")
    for _ in range(5):
        assert refusal(q).retry_after_s == pytest.approx(1.0)
    clock.now += 0.75
    assert refusal(q).retry_after_s == pytest.approx(0.25)
    clock.now += 0.25
    q.check_rate("acme")


def test_burst_zero_means_the_rate_and_at_least_one() -> None:
    # burst 0: capacity = rps (4 at once), and a rate under 1/s still admits one request
    fast, slow = quotas(rps=4), quotas(rps=0.5)
    let_through(fast, 4)
    refusal(fast)
    slow.check_rate("acme")
    assert refusal(slow).retry_after_s == pytest.approx(2.0)


def test_a_long_idle_refills_only_up_to_the_burst() -> None:
    q, clock = clocked(rps=10, burst=2)
    q.check_rate("acme")
    clock.now += 3600
    let_through(q, 2)
    refusal(q)


def test_a_clock_stepping_back_adds_nothing() -> None:
    bucket = TokenBucket(rate=1.0, capacity=1.0, tokens=0.0, stamp=10.0)
    assert bucket.take(5.0) == pytest.approx(1.0)  # earlier than the stamp: no refill, no negative refill
    assert bucket.take(10.5) == pytest.approx(0.5)
    assert bucket.take(11.0) == 0.0


def test_tenants_have_separate_buckets_and_overrides() -> None:
    # acme is limited by the default, vip by its own override, free has an unlimited override
    q = quotas(rps=1, burst=1, vip=Quota(rps=100, burst=3), free=Quota())
    q.check_rate("acme")
    refusal(q, "acme")
    q.check_rate("other")  # acme's refusal is not other's
    let_through(q, 3, "vip")
    refusal(q, "vip")
    let_through(q, 1000, "free")


def test_unlimited_when_set_to_zero() -> None:  # the defaults are limited (tests/hostile/test_metered_calls.py)
    q = TenantQuotas.of(RequestLimits(tenant_rps=0, tenant_burst=0, tenant_streams=0))
    for _ in range(1000):
        with q.admit("acme"):
            pass
    assert q.open_streams("acme") == 0


def test_refusal_message_is_one_line_and_names_the_tenant() -> None:
    err = refusal(_drained(quotas(rps=1, burst=1)))
    assert "acme" in str(err) and "requests/s" in str(err) and "\n" not in str(err)


def _drained(q: TenantQuotas) -> TenantQuotas:
    q.check_rate("acme")
    return q


# ---- open streams ----------------------------------------------------------------------------------
def test_stream_limit_refuses_the_next_and_frees_on_end() -> None:
    q = quotas(streams=2)
    with q.admit("acme"), q.admit("acme"):
        assert q.open_streams("acme") == 2
        with pytest.raises(ResourceExhausted, match="2 streams open") as info, q.admit("acme"):
            pass
        assert info.value.retry_after_s == 1.5  # the configured hint: no exact time exists
        with q.admit("other"):  # per tenant
            pass
    assert q.open_streams("acme") == 0
    with q.admit("acme"):
        pass


def test_stream_slot_is_freed_when_the_stream_fails() -> None:
    q = quotas(streams=1)
    with pytest.raises(InvalidArgument), q.admit("acme"):
        raise InvalidArgument("bad input found mid-stream")
    assert q.open_streams("acme") == 0


def test_stream_refusal_does_not_use_up_the_rate() -> None:
    # at its stream limit, a refused request leaves the bucket as it was
    q = quotas(rps=1, burst=2, streams=1)
    with q.admit("acme"):
        for _ in range(3):
            with pytest.raises(ResourceExhausted, match="streams open"), q.admit("acme"):
                pass
    with q.admit("acme"):  # the second token of the burst is still there
        pass
    with pytest.raises(ResourceExhausted, match="requests/s"), q.admit("acme"):
        pass


async def _stream(q: TenantQuotas, started: asyncio.Event) -> AsyncIterator[int]:
    """The engine's pattern: an async generator that holds a slot while it streams."""
    with q.admit("acme"):
        started.set()
        for i in range(1000):
            await asyncio.sleep(0.01)
            yield i


@pytest.mark.asyncio
async def test_stream_slot_is_freed_when_the_consumer_is_cancelled() -> None:
    # a cancelled gRPC call cancels the task iterating the stream
    q = quotas(streams=1)
    started = asyncio.Event()

    async def consume() -> None:
        async for _ in _stream(q, started):
            pass

    task = asyncio.ensure_future(consume())
    await started.wait()
    assert q.open_streams("acme") == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert q.open_streams("acme") == 0


@pytest.mark.asyncio
async def test_stream_slot_is_freed_when_the_stream_is_closed() -> None:
    # an HTTP client that leaves: the response closes the body iterator (aclose)
    q = quotas(streams=1)
    stream = _stream(q, asyncio.Event())
    assert await anext(stream) == 0
    assert q.open_streams("acme") == 1
    await stream.aclose()
    assert q.open_streams("acme") == 0


def test_idle_tenants_are_forgotten_but_not_open_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    # the state of a tenant at rest (full bucket, no stream) is dropped past MAX_IDLE_TENANTS
    monkeypatch.setattr(quota_module, "MAX_IDLE_TENANTS", 3)
    q, clock = clocked(rps=1, burst=1, streams=5)
    with q.admit("busy"):
        for t in ("a", "b"):
            q.check_rate(t)
        clock.now += 10  # a and b refill: at rest
        q.check_rate("c")
        assert set(q._tenants) == {"busy", "c"}
        assert q.open_streams("busy") == 1
    refusal(q, "c")  # c's state was kept: its bucket is still empty


# ---- settings ------------------------------------------------------------------------------------
def test_limits_fields_make_the_quotas() -> None:
    limits = RequestLimits(tenant_rps=2, tenant_burst=4, tenant_streams=3,
                           tenant_quotas={"vip": {"rps": 50}, "batch": {"streams": 1, "burst": 1}})
    q = TenantQuotas.of(limits)
    assert q.quota("acme") == Quota(2, 4, 3)
    assert q.quota("vip") == Quota(50, 4, 3)  # left-out fields take the defaults
    assert q.quota("batch") == Quota(2, 1, 1)


@pytest.mark.parametrize("bad", [
    {"vip": {"rsp": 5}},  # a typo is refused, not ignored
    {"vip": {"rps": -1}},  # negative
    {"vip": {"streams": 1.5}},  # streams are whole
])
def test_bad_tenant_quotas_are_refused(bad: dict[str, dict[str, float]]) -> None:
    with pytest.raises(ConfigError, match="tenant_quotas"):
        load_settings(RequestLimits, "limits", None, tenant_quotas=bad)


def test_tenant_quotas_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAR_LIMITS_TENANT_QUOTAS", '{"vip": {"rps": 7, "streams": 2}}')
    monkeypatch.setenv("LAR_LIMITS_TENANT_RPS", "1.5")
    q = TenantQuotas.of(load_settings(RequestLimits, "limits", None))
    burst, streams = RequestLimits().tenant_burst, RequestLimits().tenant_streams  # the defaults
    assert q.quota("vip") == Quota(7, burst, 2) and q.quota("acme") == Quota(1.5, burst, streams)


# ---- the refusal's retry hint ------------------------------------------------------------------------
def test_retry_status_carries_retry_info() -> None:
    status = retry_status(grpc.StatusCode.RESOURCE_EXHAUSTED, "slow down", 1.25)
    assert status.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0] and status.message == "slow down"
    (detail,) = status.details
    info = error_details_pb2.RetryInfo()
    assert detail.Unpack(info)
    assert info.retry_delay.ToNanoseconds() == 1_250_000_000


def test_only_resource_exhausted_with_a_hint_has_one() -> None:
    assert retry_after_of(ResourceExhausted("x", retry_after_s=2.0)) == 2.0
    assert retry_after_of(ResourceExhausted("overloaded")) is None  # the engine's queue: no hint
    assert retry_after_of(InvalidArgument("x")) is None


@pytest.mark.parametrize(("seconds", "header"), [(0.01, "1"), (1.0, "1"), (1.2, "2"), (999.5, "1000")])
def test_retry_after_header_is_whole_seconds_rounded_up(seconds: float, header: str) -> None:
    assert retry_after_header(seconds) == header


def test_http_429_has_retry_after_only_with_a_hint() -> None:
    limited = error_response(ResourceExhausted("over quota", retry_after_s=2.5))
    assert limited.status_code == 429 and limited.headers["retry-after"] == "3"
    overloaded = error_response(ResourceExhausted("overloaded"))
    assert overloaded.status_code == 429 and "retry-after" not in overloaded.headers
