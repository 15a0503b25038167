"""``kafka.*`` options of ``kafka_py``: kafka-python settings, typed like their defaults.

``kafka.<setting>`` passes ``<setting>`` (dots as underscores) to kafka-python's
``KafkaConsumer``, parsed with the shared parsers by the type of kafka-python's own
default. Settings the source must own are refused, and values of settings whose names
look secret never reach a ``repr`` or an error. Runs on the driver, inside
:func:`spark_datasource.kafka.options.parse_kafka_options`.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from clickhouse_tx.errors import ConfigurationError
from spark_datasource.kafka.option_specs import KAFKA_OPTIONS, SOURCE, kafka_option_error
from spark_datasource.options.spec import BOOL, OptionSpec, Parser, one_of

__all__ = ["KafkaParams", "kafka_params", "SECRET_NAME"]

#: Names of settings whose values are secret (masked in ``repr`` and errors).
SECRET_NAME = re.compile(r"password|secret|token|oauth|jaas|key_?file|keystore", re.I)

# kafka-python settings the source must own: changing them would break the offsets
# bookkeeping that makes a replay read exactly the same records.
_FORBIDDEN_KAFKA = {
    "auto_offset_reset": "use startingOffsets / failOnDataLoss",
    "enable_auto_commit": "offsets live in the Spark checkpoint, never in Kafka",
    "key_deserializer": "key and value are returned as binary; cast them in Spark",
    "value_deserializer": "the value is returned as binary, or decoded by value.format=json",
    "consumer_timeout_ms": "use kafkaConsumer.pollTimeoutMs",
}

_VERSION = Parser("a version like 2.5.0", lambda text: tuple(int(x) for x in text.strip().split(".")))
_NUMBER = Parser("a number", lambda text: float(text.strip()))
_INTEGER = Parser("an integer", lambda text: int(text.strip()))
_TEXT = Parser("text", lambda text: text.strip())
#: Settings whose values are checked beyond their type.
_BY_NAME: dict[str, Parser[Any]] = {
    "api_version": _VERSION,
    "isolation_level": one_of("read_committed", "read_uncommitted"),
}


class KafkaParams(tuple[Any, ...]):
    """``(name, value)`` pairs for kafka-python; secrets are masked in ``repr``."""

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={'***' if SECRET_NAME.search(k) else repr(v)}" for k, v in self)
        return f"KafkaParams({shown})"


def _kafka_python_defaults() -> Mapping[str, object]:
    # The driver parses the options before any task runs: a missing extra fails here, with the fix.
    try:
        from kafka import KafkaConsumer  # kafka-python 2.3.x
    except ImportError as e:
        raise ConfigurationError(
            "kafka_py needs kafka-python, which the base install leaves out: pip install 'clickhouse-tx[kafka]'"
        ) from e
    return KafkaConsumer.DEFAULT_CONFIG


def _parser_for(option: str, setting: str, default: object) -> Parser[Any]:
    """The parser of a kafka-python setting: by its name, else by its default's type."""
    if setting in _BY_NAME:
        return _BY_NAME[setting]
    for kind, parser in ((bool, BOOL), (int, _INTEGER), (float, _NUMBER), (str, _TEXT), (type(None), _TEXT)):
        if isinstance(default, kind):
            return parser
    raise kafka_option_error(
        option, f"kafka-python setting {setting!r} takes a {type(default).__name__}, which cannot be given as an option"
    )


def kafka_params(opts: Mapping[str, str]) -> list[tuple[str, object]]:
    """The ``kafka.*`` options (lower-cased keys) as kafka-python keywords, sorted.

    Raises
    ------
    ConfigurationError
        A setting the source owns, one kafka-python does not have, or a bad value.
    """
    defaults = _kafka_python_defaults()
    declared = KAFKA_OPTIONS.known_keys()
    out: list[tuple[str, object]] = []
    for key, raw in sorted(opts.items()):
        if not key.startswith("kafka.") or key in declared:
            continue
        setting = key[len("kafka.") :].replace(".", "_")
        if setting in _FORBIDDEN_KAFKA:
            raise kafka_option_error(key, f"cannot be set: {_FORBIDDEN_KAFKA[setting]}")
        if setting not in defaults:
            raise kafka_option_error(key, f"kafka-python has no setting {setting!r}")
        parser = _parser_for(key, setting, defaults[setting])
        spec = OptionSpec(key, None, parser, "", source=SOURCE, secret=bool(SECRET_NAME.search(setting)))
        out.append((setting, spec.parse(raw)))
    return out
