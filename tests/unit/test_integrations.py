"""The integrations' parts that need no node: the ETA of a Celery message,
the acknowledging thread, Dramatiq's retry in place (NACK DELAY) and its
fall-back to a new job, over a fake client."""

from __future__ import annotations

import importlib.util
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from disque_trio.client import ConnectionLostError, Job, JobInfo, NoJobError
from disque_trio.integrations._common import Acknowledger, SharedClient, whole_seconds

needs_celery = pytest.mark.skipif(
    importlib.util.find_spec("kombu") is None, reason="kombu is not installed ('.[test]')"
)
needs_dramatiq = pytest.mark.skipif(
    importlib.util.find_spec("dramatiq") is None, reason="dramatiq is not installed ('.[test]')"
)


class FakeClient:
    """Records calls; ``fail`` makes ack_job raise that many times."""

    def __init__(self, ttl: int = 3600) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.fail = 0
        self.ttl = ttl
        self.gate = threading.Event()
        self.gate.set()
        self.closed = False

    def _note(self, name: str, *args: Any, **kwargs: Any) -> None:
        self.calls.append((name, args, kwargs))

    def ack_job(self, *ids: str) -> int:
        self.gate.wait(5)
        self._note("ack_job", *ids)
        if self.fail:
            self.fail -= 1
            raise ConnectionLostError("lost")
        return len(ids)

    def working(self, job_id: str) -> int:
        self._note("working", job_id)
        if job_id == "gone":
            raise NoJobError("NOJOB", "Job not known")
        return 10

    def add_job(self, queue: str, body: bytes, **kwargs: Any) -> str:
        self._note("add_job", queue, body, **kwargs)
        return "D-00000000-new"

    def show(self, job_id: str) -> JobInfo:
        self._note("show", job_id)
        return JobInfo(job_id, "q", "active", 1, self.ttl, 0, 0, 60, 0, 0, [], [], None, None, b"")

    def nack(self, *ids: str, delay: float | None = None) -> int:
        self._note("nack", *ids, delay=delay)
        return len(ids)

    def hold(self, job_ids: list[str], node: tuple[str, int] | None = None) -> None:
        self._note("hold", list(job_ids), node)

    def release(self, *ids: str) -> None:
        self._note("release", *ids)

    def check_held(self) -> None:
        self._note("check_held")

    def close(self) -> None:
        self.closed = True

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]


def test_whole_seconds_round_up_and_are_capped() -> None:
    assert [whole_seconds(s) for s in (0, 0.001, 1, 1.2, -3)] == [0, 1, 1, 2, 0]
    assert whole_seconds(1e12) == 2**32 - 1


def test_acks_are_sent_in_batches_from_one_thread() -> None:
    fake = FakeClient()
    acks = Acknowledger(lambda: fake)  # type: ignore[arg-type, return-value]
    fake.gate.clear()  # the first ACKJOB waits: the others pile up meanwhile
    for i in range(50):
        acks.ack(f"id{i}")
    time.sleep(0.1)
    fake.gate.set()
    assert acks.flush(5)
    sent = [c[1] for c in fake.calls if c[0] == "ack_job"]
    assert sorted(i for batch in sent for i in batch) == sorted(f"id{i}" for i in range(50))
    assert len(sent) <= 3
    acks.close()
    assert fake.closed
    # Usable again after close (kombu reopens a closed connection).
    acks.ack("later")
    assert acks.flush(5)
    assert fake.calls[-1] == ("ack_job", ("later",), {})
    acks.close()


def test_an_ack_that_keeps_failing_is_given_up() -> None:
    fake = FakeClient()
    fake.fail = 3
    acks = Acknowledger(lambda: fake, attempts=3)  # type: ignore[arg-type, return-value]
    acks.ack("x")
    assert acks.flush(5)
    assert acks.lost == 1 and fake.names() == ["ack_job"] * 3
    fake.fail = 1  # one failure, then through
    acks.ack("y")
    assert acks.flush(5)
    assert acks.lost == 1
    acks.close()


def test_tracked_jobs_get_working_until_acked() -> None:
    fake = FakeClient()
    acks = Acknowledger(lambda: fake, keepalive=0.1)  # type: ignore[arg-type, return-value]
    acks.track(["a", "b", "gone"])
    time.sleep(0.45)
    acks.ack("a")
    acks.untrack("b")
    assert acks.flush(5)
    before = fake.names().count("working")
    time.sleep(0.3)
    workings = [c[1][0] for c in fake.calls if c[0] == "working"]
    assert workings.count("a") >= 2 and workings.count("b") >= 2
    assert workings.count("gone") == 1  # -NOJOB: no longer tracked
    assert fake.names().count("working") == before  # nothing tracked any more
    acks.close()


def test_tracked_jobs_are_held_by_the_threads_client_and_watched_while_held() -> None:
    """The thread's client holds what the process works on (its nodes
    checked every ``watch`` seconds, WORKING elsewhere when one is gone):
    released by the ACKJOB, or by untrack; no checks once nothing is held."""
    fake = FakeClient()
    acks = Acknowledger(lambda: fake, watch=0.1)  # type: ignore[arg-type, return-value]
    acks.track(["a", "b"], ("h", 1))
    time.sleep(0.35)
    acks.ack("a")
    acks.untrack("b")
    assert acks.flush(5)
    checks = fake.names().count("check_held")
    assert checks >= 2
    time.sleep(0.3)
    assert fake.names().count("check_held") == checks
    assert fake.calls[0] == ("hold", (["a", "b"], ("h", 1)), {})
    assert ("release", ("b",), {}) in fake.calls and ("ack_job", ("a",), {}) in fake.calls
    assert "working" not in fake.names()  # no keep-alive asked for
    acks.close()


def test_a_shared_client_is_made_once_and_closed() -> None:
    made: list[FakeClient] = []

    def factory() -> Any:
        made.append(FakeClient())
        return made[-1]

    shared = SharedClient(factory)
    with shared() as a:
        pass
    with shared() as b:
        pass
    assert len(made) == 1 and a is b
    shared.close()
    assert made[0].closed


@needs_celery
def test_celery_eta_becomes_a_delay_in_whole_seconds_rounded_down() -> None:
    from disque_trio.integrations.celery import eta_delay

    now = datetime(2030, 1, 1, tzinfo=UTC)

    def message(eta: object) -> dict[str, Any]:
        return {"headers": {"eta": eta}}

    assert eta_delay({"headers": {}}, now) == 0
    assert eta_delay(message(None), now) == 0
    assert eta_delay(message((now + timedelta(seconds=10.7)).isoformat()), now) == 10
    assert eta_delay(message((now + timedelta(seconds=0.9)).isoformat()), now) == 0
    assert eta_delay(message((now - timedelta(seconds=30)).isoformat()), now) == 0
    naive = (now + timedelta(seconds=30)).replace(tzinfo=None).isoformat()
    assert eta_delay(message(naive), now) == 0  # whose clock?
    assert eta_delay(message("not a date"), now) == 0


@needs_celery
def test_celery_settings_and_the_url_shown() -> None:
    from disque_trio.integrations.celery import Settings, mask_password

    settings = Settings.from_options({"visibility_timeout": 30, "max_retries": 3})
    assert settings.visibility_timeout == 30 and settings.replicate is None
    with pytest.raises(ValueError):
        Settings.from_options({"fetch_count": 0})
    assert mask_password("disque://:s3cret@h1:7711,h2:7711") == "disque://:**@h1:7711,h2:7711"
    assert mask_password("disque://h1:7711") == "disque://h1:7711"


@needs_celery
def test_the_disque_scheme_is_registered_with_kombu() -> None:
    from kombu import Connection
    from kombu.transport import TRANSPORT_ALIASES

    import disque_trio.integrations.celery as transport

    assert TRANSPORT_ALIASES["disque"] == "disque_trio.integrations.celery:Transport"
    conn = Connection("disque://:pw@127.0.0.1:1,127.0.0.2:2")
    assert conn.transport_cls == "disque"
    assert isinstance(conn.transport, transport.Transport)
    assert conn.as_uri() == "disque://:**@127.0.0.1:1,127.0.0.2:2"
    # The no-import way: the class named, the URL left whole.
    conn = Connection(
        "disque://127.0.0.1:1,127.0.0.2:2",
        transport="disque_trio.integrations.celery:Transport",
    )
    assert conn.transport.url == "disque://127.0.0.1:1,127.0.0.2:2"


def _delivered(broker: Any, nacks: int = 0) -> Any:
    from dramatiq.message import Message

    from disque_trio.integrations.dramatiq import DisqueMessageProxy

    message = Message("q", "work", (1,), {}, {"retries": nacks})
    job = Job("D-00000001-abc", "q", message.encode(), nacks=nacks)
    return DisqueMessageProxy(message, job)


@needs_dramatiq
def test_dramatiq_retry_is_a_nack_delay_of_the_same_job() -> None:
    from disque_trio.integrations.dramatiq import DisqueBroker

    fake = FakeClient(ttl=3600)
    broker = DisqueBroker("disque://127.0.0.1:1", retry=30, middleware=[])
    broker.shared = SharedClient(lambda: fake)  # type: ignore[arg-type, return-value]
    message = _delivered(broker)
    broker.enqueue(message, delay=1500)
    assert fake.names() == ["show", "nack"]
    assert fake.calls[1] == ("nack", ("D-00000001-abc",), {"delay": 2})
    assert message.retried
    broker.acks.close()


@needs_dramatiq
def test_dramatiq_retry_past_the_ttl_is_a_new_job() -> None:
    from disque_trio.integrations.dramatiq import JOB_ID, DisqueBroker

    fake = FakeClient(ttl=100)  # the job dies before delay + RETRY
    broker = DisqueBroker("disque://127.0.0.1:1", retry=30, middleware=[])
    broker.shared = SharedClient(lambda: fake)  # type: ignore[arg-type, return-value]
    message = _delivered(broker)
    message.options[JOB_ID] = message.job_id
    message.options["retries"] = 1
    returned = broker.enqueue(message, delay=80_000)
    assert fake.names() == ["show", "add_job"]
    _, (queue, body), kwargs = fake.calls[1]
    assert queue == "q" and kwargs["delay"] == 80 and kwargs["ttl"] == broker.ttl + 80
    assert kwargs["retry"] == 30
    assert b"disque_job_id" not in body and b'"retries":1' in body
    assert returned.options[JOB_ID] == "D-00000000-new" and not message.retried
    broker.acks.close()


def test_celery_a_message_expiration_becomes_the_jobs_ttl() -> None:
    from disque_trio.integrations.celery import expiration_ttl

    def message(value: object) -> dict[str, object]:
        return {"properties": {"expiration": value}}

    assert expiration_ttl(message("2000")) == 2
    assert expiration_ttl(message("2001")) == 3  # rounded up: never delivered late
    assert expiration_ttl(message("0")) == 1
    assert expiration_ttl(message(1500)) == 2
    for bad in (None, "soon", "-5", "nan", True, [1]):
        assert expiration_ttl(message(bad)) is None
    assert expiration_ttl({}) is None
