"""The options of the exactly-once ``foreachBatch`` helper, checked once on the driver (frozen).

The writer's options by the same names and parsing as ``format("clickhouse_tx")``
(:class:`~spark_datasource.options.writer_options.WriterOptions`), less the sink's own, and the
helper's: ``app_id``, ``checkpoint_location``, ``driver_max_bytes``
(:func:`spark_datasource.foreach.helper.clickhouse_tx_batch` says what each does).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Mapping

from clickhouse_tx.errors import ConfigurationError
from clickhouse_tx.ids import canonical_location
from clickhouse_tx.interfaces import Mode
from spark_datasource.options.spec import POSITIVE_INT
from spark_datasource.options.writer_options import WriterOptions

#: The default of ``driver_max_bytes``: the Arrow bytes of one table's micro-batch the
#: driver collects before the helper writes it from the executors instead.
DEFAULT_DRIVER_MAX_BYTES = 256 * 1024 * 1024

#: Writer options of the sink that mean nothing to the helper (lower-cased): the helper's
#: key is ``(app_id, batch_id)``, it writes one server, and Spark's checkpoint is its own.
_SINK_ONLY = (
    "transactional_id",
    "decision_log",
    "visibility",
    "idempotence_key",
    "shards",
    "sharding_key",
    "shard_weights",
    "table_column",
    "tables",
    "checkpointlocation",
    "queryname",
    "path",
)


@dataclasses.dataclass(frozen=True)
class ForeachOptions:
    """The helper's options, checked once on the driver when the helper is built (frozen)."""

    writer: WriterOptions
    app_id: str
    checkpoint_location: str | None
    #: Arrow bytes of one table's micro-batch the driver collects (see :func:`clickhouse_tx_batch`).
    driver_max_bytes: int = DEFAULT_DRIVER_MAX_BYTES
    #: The writer options as given (the sink's batch job parses them again); never shown.
    sink_options: tuple[tuple[str, str], ...] = dataclasses.field(default=(), repr=False)

    @classmethod
    def parse(
        cls,
        *,
        app_id: str,
        checkpoint_location: str | None,
        options: Mapping[str, object],
        driver_max_bytes: object = DEFAULT_DRIVER_MAX_BYTES,
    ) -> "ForeachOptions":
        """The writer's options (same names, same parsing as ``format("clickhouse_tx")``) and the helper's own.

        Raises
        ------
        ConfigurationError
            An unknown or malformed option, an option of the sink only, a mode other than
            ``transaction`` and ``dedup``, or a malformed ``app_id``, ``checkpoint_location``
            or ``driver_max_bytes``.
        """
        texts = {str(k): _option_text(v) for k, v in options.items()}
        for name in texts:
            if name.lower() in _SINK_ONLY or name.lower().startswith("fault."):
                raise ConfigurationError(
                    f"option {name} is the clickhouse_tx sink's; the foreachBatch helper is keyed by "
                    "(app_id, batch_id) and takes the query's checkpoint as checkpoint_location"
                )
        writer = WriterOptions.parse(texts, streaming=False)
        _check_mode(writer.mode)
        if checkpoint_location is not None:
            canonical_location(checkpoint_location, os.getcwd())  # malformed: refused here
        limit = _check_driver_max_bytes(driver_max_bytes)
        return cls(writer, _check_app_id(app_id), checkpoint_location, limit, tuple(sorted(texts.items())))

    def for_table(self, database: str, table: str) -> WriterOptions:
        """The writer options of one target table."""
        return dataclasses.replace(self.writer, database=database, table=table)


def _option_text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _check_mode(mode: Mode) -> None:
    if mode in (Mode.TRANSACTION, Mode.DEDUP):
        return
    raise ConfigurationError(
        f"option mode={mode.value!r}: the foreachBatch helper writes in mode 'transaction' (one "
        "ClickHouse transaction per micro-batch) or 'dedup' (Replicated and Cloud tables: chunks "
        "named by the key and their rows); for other modes use writeStream.format('clickhouse_tx')"
    )


def _check_app_id(app_id: object) -> str:
    text = app_id.strip() if isinstance(app_id, str) else ""
    if not text or len(text) > 256 or not text.isprintable():
        raise ConfigurationError(
            f"option app_id={app_id!r}: expected 1 to 256 printable characters naming the stream "
            "(one app_id per streaming query, kept across its restarts)"
        )
    return text


def _check_driver_max_bytes(value: object) -> int:
    try:
        if isinstance(value, bool):
            raise ValueError()
        return POSITIVE_INT.convert(str(value))
    except ValueError:
        raise ConfigurationError(
            f"option driver_max_bytes={value!r}: expected {POSITIVE_INT.expected} (bytes of Arrow the driver "
            "collects of one table's micro-batch)"
        ) from None


__all__ = ["DEFAULT_DRIVER_MAX_BYTES", "ForeachOptions"]
