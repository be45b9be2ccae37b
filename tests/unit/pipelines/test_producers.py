"""The broker-native producers' command line and message, and the Scenario field that picks them."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from lab.pipelines.producers import TARGETS, body, parse_args
from lab.scenario import Scenario


def test_arguments_are_checked_before_anything_connects(capsys: pytest.CaptureFixture[str]) -> None:
    a = parse_args(["--target", "pg", "--messages", "5", "--out", "x.json"])
    assert (a.target, a.messages, a.producers, a.start_file) == ("pg", 5, 200, None)
    for argv, says in (
        (["--target", "nats", "--messages", "5", "--out", "x"], "invalid choice: 'nats'"),
        (["--target", "kafka", "--messages", "0", "--out", "x"], "must be at least 1"),
        (["--target", "kafka", "--messages", "5", "--producers", "0", "--out", "x"],
         "must be at least 1"),
        (["--target", "kafka", "--messages", "5"], "--out"),
    ):
        with pytest.raises(SystemExit) as exc:
            parse_args(argv)
        assert exc.value.code == 2
        assert says in capsys.readouterr().err
    assert TARGETS == ("kafka", "rabbitmq", "pg")


def test_the_message_is_the_reference_producers_json() -> None:
    m = orjson.loads(body(7))
    assert list(m) == ["id", "content", "createdAt"]
    assert m["id"] == 7 and m["content"] == "helloworld"
    assert m["createdAt"].endswith("+00:00") and "T" in m["createdAt"]


def test_scenario_producer_is_validated_and_named() -> None:
    assert Scenario().producer == "web" and Scenario().slug == "wal-c1-m100000-s200"
    assert Scenario(pipeline="kafka", producer="direct").slug == "kafka-c1-m100000-s200-direct"
    with pytest.raises(ValueError, match="unknown producer 'broker': choose one of web, direct"):
        Scenario(producer="broker")
    with pytest.raises(ValueError, match="rate needs producer='web'"):
        Scenario(producer="direct", rate=100.0)


def test_consumers_parse_what_their_producer_wrote() -> None:
    from lab.pipelines import kafka, rabbitmq
    from lab.settings import Settings

    envelope = orjson.dumps({"before": None, "op": "c", "source": {}, "after": {
        "id": 7, "content": "helloworld", "created_at": "2026-01-02T03:04:05Z"}})
    update = orjson.dumps({"before": {}, "op": "u", "after": {
        "id": 7, "content": "x", "created_at": "2026-01-02T03:04:05Z"}})
    plain = body(7)
    for module, source in ((kafka, kafka.KafkaSource), (rabbitmq, rabbitmq.RabbitSource)):
        web = source(Scenario(pipeline=module.__name__.rsplit(".")[-1]), Settings(), 3)
        direct = source(Scenario(pipeline=module.__name__.rsplit(".")[-1], producer="direct"),
                        Settings(), 3)
        assert web._row(envelope) == (7, "helloworld", "2026-01-02T03:04:05Z")
        assert direct._row(plain)[:2] == (7, "helloworld")
        assert direct._row(plain)[2] == orjson.loads(plain)["createdAt"]
        assert direct.me.endswith("-3") and not direct.me.startswith("dbz-")
        assert web.me.startswith("dbz-")
    assert rabbitmq.RabbitSource(Scenario(pipeline="rabbitmq"), Settings(), 0)._row(update) is None
    direct_kafka = kafka.KafkaSource(Scenario(pipeline="kafka", producer="direct"), Settings(), 0)
    assert direct_kafka.topic == "messages"


def test_reset_is_a_scenario_field_and_a_producer_option(capsys: pytest.CaptureFixture[str]) -> None:
    assert Scenario().reset == "discard"  # the reference's Npgsql pool behaviour is the default
    assert Scenario(reset="none").reset == "none"
    with pytest.raises(ValueError, match="unknown reset 'all': choose one of discard, none"):
        Scenario(reset="all")
    assert parse_args(["--target", "pg", "--messages", "5", "--out", "x"]).reset == "discard"
    with pytest.raises(SystemExit):
        parse_args(["--target", "pg", "--messages", "5", "--out", "x", "--reset", "all"])
    assert "invalid choice: 'all'" in capsys.readouterr().err


def test_web_refuses_a_prepared_insert_with_discard(capsys: pytest.CaptureFixture[str]) -> None:
    from lab.workload.web import main, serve

    with pytest.raises(ValueError, match="--prepare needs --reset none"):
        asyncio.run(serve("127.0.0.1", 1, "host=unused", prepare=True))
    with pytest.raises(SystemExit) as exc:
        main(["--port", "1", "--dsn", "x", "--prepare"])
    assert exc.value.code == 2 and "--prepare needs --reset none" in capsys.readouterr().err
