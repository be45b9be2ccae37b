"""Versions of the broker client libraries (this layer is the one allowed to import them)."""

from __future__ import annotations

import importlib.metadata as md


def broker_client_versions() -> dict[str, str | None]:
    """confluent-kafka with the librdkafka it links, aio-pika with aiormq."""
    out: dict[str, str | None] = {}
    for name in ("confluent-kafka", "aio-pika", "aiormq", "pamqp"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    try:
        import confluent_kafka

        out["librdkafka"] = confluent_kafka.libversion()[0]
    except Exception:
        out["librdkafka"] = None
    return out
