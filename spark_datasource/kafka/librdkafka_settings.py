"""``kafka.client``: which Kafka client an executor reads with, and librdkafka's settings.

``kafka_py`` reads through kafka-python (pure Python, the declared dependency) or
through librdkafka, the C client bundled in the ``confluent-kafka`` wheel, which parses
records in C. The ``kafka.*`` options keep kafka-python's names either way (they are
checked against kafka-python's settings, :mod:`spark_datasource.kafka.client_settings`);
for librdkafka each is translated here to librdkafka's own name
(``kafka.ssl.cafile`` -> ``ssl.ca.location``, ``kafka.sasl.plain.password`` ->
``sasl.password``, ...). A setting with no librdkafka equivalent is refused with
``kafka.client=librdkafka`` and makes ``auto`` choose kafka-python.

- :func:`choose_client` (driver, when the options are parsed): ``auto`` resolved,
  ``librdkafka`` refused with a clear message where ``confluent_kafka`` is missing.
- :func:`librdkafka_config` (executors): the ``confluent_kafka.Consumer`` config of
  a read's options.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable, Mapping

from spark_datasource.kafka.option_specs import kafka_option_error

__all__ = ["CLIENTS", "LIBRDKAFKA_NAMES", "choose_client", "librdkafka_available", "librdkafka_config"]

log = logging.getLogger(__name__)

#: Values of ``kafka.client``.
CLIENTS = ("auto", "kafka-python", "librdkafka")

#: The group id librdkafka's consumer is created with (confluent-kafka requires one).
#: The source never subscribes or commits: the id is only named in the coordinator
#: lookup librdkafka makes for every consumer that has one.
GROUP_ID = "kafka_py"


def _flag(value: object) -> str:
    return "true" if value else "false"


def _hostname_check(value: object) -> str:
    return "https" if value else "none"


def _servers(value: object) -> str:
    return ",".join(value) if isinstance(value, (list, tuple)) else str(value)


def _same(value: object) -> object:
    return value


#: kafka-python setting -> (librdkafka setting, value converter). The settings the
#: source itself sets (:meth:`~spark_datasource.kafka.options.KafkaOptions.consumer_config`)
#: and every ``kafka.*`` setting that has a librdkafka equivalent.
LIBRDKAFKA_NAMES: dict[str, tuple[str, Callable[[object], object]]] = {
    "bootstrap_servers": ("bootstrap.servers", _servers),
    "client_id": ("client.id", _same),
    "enable_auto_commit": ("enable.auto.commit", _flag),
    "allow_auto_create_topics": ("allow.auto.create.topics", _flag),
    "request_timeout_ms": ("socket.timeout.ms", _same),
    "isolation_level": ("isolation.level", _same),
    "fetch_max_wait_ms": ("fetch.wait.max.ms", _same),
    "fetch_min_bytes": ("fetch.min.bytes", _same),
    "fetch_max_bytes": ("fetch.max.bytes", _same),
    "max_partition_fetch_bytes": ("max.partition.fetch.bytes", _same),
    "check_crcs": ("check.crcs", _flag),
    "receive_buffer_bytes": ("socket.receive.buffer.bytes", _same),
    "send_buffer_bytes": ("socket.send.buffer.bytes", _same),
    "reconnect_backoff_ms": ("reconnect.backoff.ms", _same),
    "reconnect_backoff_max_ms": ("reconnect.backoff.max.ms", _same),
    "retry_backoff_ms": ("retry.backoff.ms", _same),
    "connections_max_idle_ms": ("connections.max.idle.ms", _same),
    "metadata_max_age_ms": ("metadata.max.age.ms", _same),
    "security_protocol": ("security.protocol", lambda v: str(v).lower()),
    "ssl_cafile": ("ssl.ca.location", _same),
    "ssl_certfile": ("ssl.certificate.location", _same),
    "ssl_keyfile": ("ssl.key.location", _same),
    "ssl_password": ("ssl.key.password", _same),
    "ssl_crlfile": ("ssl.crl.location", _same),
    "ssl_check_hostname": ("ssl.endpoint.identification.algorithm", _hostname_check),
    "sasl_mechanism": ("sasl.mechanisms", _same),
    "sasl_plain_username": ("sasl.username", _same),
    "sasl_plain_password": ("sasl.password", _same),
}
#: Settings of kafka-python's own working that librdkafka does in its own way: accepted
#: and left out of librdkafka's config (librdkafka negotiates API versions, and the
#: source asks for at most ``maxRecordsPerBatch`` records per call itself).
IGNORED_BY_LIBRDKAFKA = frozenset({"api_version", "api_version_auto_timeout_ms", "max_poll_records"})
#: Settings the source sets for kafka-python that mean nothing to librdkafka's consumer.
_SOURCE_ONLY = frozenset({"group_id", "auto_offset_reset"})


@functools.lru_cache(maxsize=1)
def librdkafka_available() -> bool:
    """True when ``confluent_kafka`` (which bundles librdkafka) imports in this process."""
    try:
        import confluent_kafka  # noqa: F401
    except ImportError:
        return False
    return True


def unmapped(params: Mapping[str, object]) -> list[str]:
    """The ``kafka.*`` options among kafka-python ``params`` that librdkafka has no name for."""
    return sorted(
        "kafka." + k.replace("_", ".")
        for k in params
        if k not in LIBRDKAFKA_NAMES and k not in IGNORED_BY_LIBRDKAFKA and k not in _SOURCE_ONLY
    )


def choose_client(asked: str, params: Mapping[str, object]) -> str:
    """The client a read uses: ``kafka-python`` or ``librdkafka`` (driver).

    ``auto`` is librdkafka when ``confluent_kafka`` imports and every ``kafka.*``
    setting has a librdkafka name, else kafka-python.

    Raises
    ------
    ConfigurationError
        ``librdkafka`` asked for where ``confluent_kafka`` does not import, or with a
        ``kafka.*`` setting librdkafka has no name for; naming ``kafka.client``.
    """
    if asked == "kafka-python":
        return asked
    missing = unmapped(params)
    if asked == "librdkafka":
        if not librdkafka_available():
            raise kafka_option_error(
                "kafka.client",
                "librdkafka needs the confluent-kafka package (which bundles librdkafka) on the driver and the "
                "executors: pip install 'confluent-kafka>=2.4', or use kafka.client=kafka-python",
            )
        if missing:
            raise kafka_option_error(
                missing[0],
                "has no librdkafka equivalent that kafka_py maps; remove it or use kafka.client=kafka-python",
            )
        return asked
    if librdkafka_available() and not missing:
        return "librdkafka"
    if missing:
        log.info("kafka_py: kafka.client=auto reads with kafka-python: librdkafka has no equivalent of %s", missing)
    return "kafka-python"


def librdkafka_config(consumer_config: Mapping[str, object], max_records_per_batch: int) -> dict[str, Any]:
    """``confluent_kafka.Consumer`` settings from kafka-python's ``consumer_config`` (executors).

    Offsets are the source's: no auto commit, no offset store, and a fetch out of range
    is reported (``auto.offset.reset=error``) so the source decides about data loss.
    librdkafka fetches in the background; ``queued.min.messages`` bounds its prefetch to
    about two Arrow batches, and it fetches again 5 ms after the reader has drained it.
    """
    cfg: dict[str, Any] = {
        "group.id": GROUP_ID,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "error",
        "enable.partition.eof": False,
        "queued.min.messages": max(1000, 2 * max_records_per_batch),
        # librdkafka's 1000 ms pause of a partition whose prefetch is full would stall
        # each read that outruns its prefetch by a second.
        "fetch.queue.backoff.ms": 5,
        # A broker closing an idle connection is routine (kafka-python does not log it either).
        "log.connection.close": False,
    }
    for setting, value in consumer_config.items():
        if setting in LIBRDKAFKA_NAMES and value is not None:
            name, convert = LIBRDKAFKA_NAMES[setting]
            cfg[name] = convert(value)
    return cfg
