"""The consumer's hand-packed ``basic.ack`` frame is byte for byte what pamqp would send."""

from __future__ import annotations

import pamqp.frame
import pytest
from pamqp import commands

from lab.pipelines.rabbitmq import ack_frame

BOUNDS = [(1, 1), (1, 999), (7, 2**32 + 5), (65535, 2**63 - 1)]  # pamqp packs tags as signed


@pytest.mark.parametrize(("channel", "tag"), BOUNDS)
def test_ack_frame_matches_pamqp(channel: int, tag: int) -> None:
    frame = ack_frame(channel, tag)
    expected = pamqp.frame.marshal(commands.Basic.Ack(delivery_tag=tag, multiple=False), channel)
    assert frame == expected
    consumed, number, parsed = pamqp.frame.unmarshal(frame)
    assert (consumed, number) == (len(frame), channel)
    assert isinstance(parsed, commands.Basic.Ack)
    assert (parsed.delivery_tag, parsed.multiple) == (tag, False)
