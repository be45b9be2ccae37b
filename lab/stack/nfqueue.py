"""The nfnetlink_queue protocol, as much of it as a packet delayer needs (pure: bytes in, bytes out).

An ``iptables … -j NFQUEUE --queue-num K`` rule hands each matching packet to whoever is bound to
queue ``K`` of the namespace, over a ``NETLINK_NETFILTER`` socket, and the packet waits in the
kernel until a verdict names it. Three messages do it (``linux/netfilter/nfnetlink_queue.h``):

* ``NFQNL_MSG_CONFIG`` binds the queue (``NFQNL_CFG_CMD_BIND``), sets the copy mode to
  ``NFQNL_COPY_META`` (no payload copied: only the packet's id is needed), the queue's length and
  the ``NFQA_CFG_F_GSO`` flag (a TCP super-packet is queued whole, not segmented first);
* ``NFQNL_MSG_PACKET`` from the kernel carries ``NFQA_PACKET_HDR`` with the packet's id (ids
  increase by one per packet and queue);
* ``NFQNL_MSG_VERDICT_BATCH`` gives one verdict to every queued packet whose id is at most the one
  named (wrap-around safe in the kernel): with a constant delay packets are released in the order
  they came, so one message releases every packet that is due.

Every message is a netlink header (length, type = subsystem << 8 | message, flags, sequence, port)
then ``struct nfgenmsg`` (family, version, queue number big-endian) then attributes (length, type,
value padded to 4 bytes). Values inside attributes are big-endian.
"""

from __future__ import annotations

import struct

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET = 0
NFQNL_MSG_CONFIG = 2
NFQNL_MSG_VERDICT_BATCH = 3
NLMSG_ERROR = 2
NLM_F_REQUEST = 0x1
NLM_F_ACK = 0x4

NFQA_PACKET_HDR = 1
NFQA_VERDICT_HDR = 2
NFQA_CFG_CMD = 1
NFQA_CFG_PARAMS = 2
NFQA_CFG_QUEUE_MAXLEN = 3
NFQA_CFG_MASK = 4
NFQA_CFG_FLAGS = 5
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_META = 1
NFQA_CFG_F_GSO = 0x4
NF_ACCEPT = 1
AF_INET = 2
NLA_TYPE_MASK = 0x3FFF  # without NLA_F_NESTED and NLA_F_NET_BYTEORDER

_NLMSGHDR = struct.Struct("=IHHII")
_NFGENMSG = struct.Struct(">BBH")  # family (AF_UNSPEC), version (NFNETLINK_V0), queue number
_NLATTR = struct.Struct("=HH")
HEADER = _NLMSGHDR.size + _NFGENMSG.size  # 20: where a message's attributes start


def _align(n: int) -> int:
    return (n + 3) & ~3


def attr(kind: int, value: bytes) -> bytes:
    """One netlink attribute, padded to 4 bytes."""
    size = _NLATTR.size + len(value)
    return _NLATTR.pack(size, kind) + value + b"\0" * (_align(size) - size)


def message(kind: int, queue: int, attrs: bytes, *, seq: int = 0, flags: int = NLM_F_REQUEST) -> bytes:
    """One nfnetlink_queue message: ``kind`` (``NFQNL_MSG_*``) for queue ``queue``."""
    body = _NFGENMSG.pack(0, 0, queue) + attrs
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), NFNL_SUBSYS_QUEUE << 8 | kind, flags, seq, 0) + body


def bind(queue: int, maxlen: int, *, seq: int = 1) -> bytes:
    """Bind ``queue``, copy metadata only (the id), queue up to ``maxlen`` packets, take GSO packets
    whole; acknowledged (``NLMSG_ERROR`` with 0) so that a failure is seen at once."""
    attrs = (attr(NFQA_CFG_CMD, struct.pack(">BBH", NFQNL_CFG_CMD_BIND, 0, AF_INET))
             + attr(NFQA_CFG_PARAMS, struct.pack(">IB", 0, NFQNL_COPY_META))
             + attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack(">I", maxlen))
             + attr(NFQA_CFG_FLAGS, struct.pack(">I", NFQA_CFG_F_GSO))
             + attr(NFQA_CFG_MASK, struct.pack(">I", NFQA_CFG_F_GSO)))
    return message(NFQNL_MSG_CONFIG, queue, attrs, seq=seq, flags=NLM_F_REQUEST | NLM_F_ACK)


def accept_upto(queue: int, packet_id: int) -> bytes:
    """Accept every packet of ``queue`` whose id is at most ``packet_id`` (not acknowledged)."""
    return message(NFQNL_MSG_VERDICT_BATCH, queue, attr(NFQA_VERDICT_HDR, struct.pack(">II", NF_ACCEPT, packet_id)))


def packet_id(msg: bytes | memoryview, offset: int = 0) -> int | None:
    """The id of the packet in the ``NFQNL_MSG_PACKET`` at ``offset`` of ``msg``; None for any other
    message (an error, an acknowledgement)."""
    length, kind = _NLMSGHDR.unpack_from(msg, offset)[:2]
    if kind != (NFNL_SUBSYS_QUEUE << 8 | NFQNL_MSG_PACKET):
        return None
    at, end = offset + HEADER, offset + length
    while at + _NLATTR.size <= end:
        size, akind = _NLATTR.unpack_from(msg, at)
        if size < _NLATTR.size:
            return None
        if akind & NLA_TYPE_MASK == NFQA_PACKET_HDR:
            return int(struct.unpack_from(">I", msg, at + _NLATTR.size)[0])
        at += _align(size)
    return None


def error_code(msg: bytes | memoryview, offset: int = 0) -> int | None:
    """The (negative errno, or 0 for an acknowledgement) of an ``NLMSG_ERROR``; None otherwise."""
    kind = _NLMSGHDR.unpack_from(msg, offset)[1]
    if kind != NLMSG_ERROR:
        return None
    return int(struct.unpack_from("=i", msg, offset + _NLMSGHDR.size)[0])


def messages(buf: bytes | memoryview) -> list[int]:
    """The offsets of the netlink messages in one datagram."""
    out, at = [], 0
    while at + _NLMSGHDR.size <= len(buf):
        length = _NLMSGHDR.unpack_from(buf, at)[0]
        if length < _NLMSGHDR.size:
            break
        out.append(at)
        at += _align(length)
    return out
