"""A broker that has not yet learned of a new topic means "ask again", never a failed run."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import KafkaError, KafkaException

from lab.pipelines import kafka_admin as kafka


def _unknown() -> KafkaException:
    return KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART))


@pytest.fixture(autouse=True)
def _no_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kafka, "POLL_INTERVAL", 0.0)


def test_an_unknown_topic_answer_is_asked_again_until_the_value_comes() -> None:
    answers: list[object] = [_unknown(), _unknown(), {"isr_min": 3}]

    def fetch() -> object:
        a = answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return a

    assert kafka.settled(fetch, time.monotonic() + 5, "replicas") == {"isr_min": 3}
    assert answers == []


def test_any_other_kafka_error_is_raised_at_once() -> None:
    calls = 0

    def fetch() -> object:
        nonlocal calls
        calls += 1
        raise KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))

    with pytest.raises(KafkaException):
        kafka.settled(fetch, time.monotonic() + 5, "replicas")
    assert calls == 1


def test_an_answer_still_unknown_at_the_deadline_says_what_was_awaited() -> None:
    def fetch() -> object:
        raise _unknown()

    with pytest.raises(TimeoutError, match="id of topic t"):
        kafka.settled(fetch, time.monotonic() - 1, "id of topic t")


def test_a_poll_check_that_meets_an_unknown_topic_keeps_polling() -> None:
    answers: list[object] = [_unknown(), False, True]

    def check() -> bool:
        a = answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return bool(a)

    kafka.poll_until(check, time.monotonic() + 5, "in sync")
    assert answers == []
