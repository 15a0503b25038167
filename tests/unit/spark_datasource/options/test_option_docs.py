"""Each option is declared once: the docs' option tables and the parsed values follow the declarations."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from clickhouse_tx.errors import ConfigurationError
from clickhouse_tx.interfaces import Target
from clickhouse_tx.retry import RetryPolicy
from spark_datasource.kafka.option_specs import KAFKA_OPTIONS
from spark_datasource.kafka.options import parse_kafka_options
from spark_datasource.option_docs import DOCS, TABLES, main, render_table, rewrite
from spark_datasource.options.spec import POSITIVE_INT, TEXT, OptionFamily, OptionSpec
from spark_datasource.options.writer_options import WriterOptions
from spark_datasource.options.writer_specs import WRITER_OPTIONS


def table_in_docs(doc: str, name: str) -> str:
    """The lines between the markers of table ``name`` in ``docs/<doc>``."""
    text = (DOCS / doc).read_text(encoding="utf-8")
    marker = f"<!-- options table {name}:"
    assert marker in text, f"docs/{doc} has no options table {name!r}"
    body = text.split(marker, 1)[1].split("-->", 1)[1]
    return body.split(f"<!-- end of options table {name} -->", 1)[0].strip("\n")


@pytest.mark.parametrize("doc, name, family, section", TABLES, ids=[t[1] for t in TABLES])
def test_each_options_table_in_the_docs_is_what_the_declarations_render(
    doc: str, name: str, family: OptionFamily, section: str
) -> None:
    assert table_in_docs(doc, name) == render_table(family, section), (
        f"docs/{doc} table {name!r} differs from the declarations: run python -m spark_datasource.option_docs"
    )


def test_the_generator_finds_nothing_to_change_in_the_committed_docs() -> None:
    assert main(["--check"]) == 0


def test_every_declared_option_has_one_row_and_every_row_is_a_declared_option() -> None:
    for family in (WRITER_OPTIONS, KAFKA_OPTIONS):
        rows = [
            line.split(" | ")[0].removeprefix("| ").split("`")[1]
            for doc, name, fam, _ in TABLES
            if fam is family
            for line in table_in_docs(doc, name).splitlines()[2:]
        ]
        assert sorted(rows) == sorted(s.name for s in family.specs)


def test_an_option_added_without_its_row_or_a_row_without_its_option_is_caught() -> None:
    doc, name, family, section = TABLES[0]
    text = (DOCS / doc).read_text(encoding="utf-8")
    added = OptionFamily(family.source, family.docs, (*family.specs, OptionSpec("new_option", None, TEXT, "new.")))
    assert rewrite(text, name, render_table(added, section)) != text
    removed = OptionFamily(family.source, family.docs, family.specs[1:])
    assert rewrite(text, name, render_table(removed, section)) != text
    assert rewrite(text, name, render_table(family, section)) == text


def test_a_document_without_the_markers_is_refused_naming_them() -> None:
    with pytest.raises(ValueError, match="no markers of the options table 'writer'"):
        rewrite("# no table here\n", "writer", "| option |")


def dataclass_defaults(cls: type) -> dict[str, Any]:
    return {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}


@pytest.mark.parametrize(
    "family, parsed",
    [
        (WRITER_OPTIONS, lambda: WriterOptions.parse({"url": "http://h:8123", "table": "t"}, streaming=False)),
        (KAFKA_OPTIONS, lambda: parse_kafka_options({"bootstrap.servers": "h:9092", "subscribe": "t"})),
    ],
    ids=["writer", "kafka_py"],
)
def test_every_field_an_option_fills_takes_the_declared_default_when_the_option_is_not_given(
    family: OptionFamily, parsed: Any
) -> None:
    value = parsed()
    filled = [s for s in family.specs if s.field]
    assert filled
    for spec in filled:
        assert getattr(value, spec.field) == spec.default, spec.name
        assert spec.field not in dataclass_defaults(type(value)), f"{spec.field}: its default is the declaration's"


def test_target_and_retry_policy_defaults_are_the_options_defaults() -> None:
    target, retry = dataclass_defaults(Target), dataclass_defaults(RetryPolicy)
    assert WRITER_OPTIONS.default("user") == target["user"]
    assert WRITER_OPTIONS.default("password") == target["password"]
    for option, field in [
        ("connect_timeout", "connect_timeout_s"),
        ("request_timeout", "request_timeout_s"),
        ("session_timeout", "session_timeout_s"),
    ]:
        assert WRITER_OPTIONS.default(option) == target[field]
    assert WRITER_OPTIONS.default("retry.attempts") == retry["max_attempts"]
    assert WRITER_OPTIONS.default("retry.max_seconds") == retry["max_total_s"]
    plain = WriterOptions.parse({"url": "http://h:8123", "table": "t"}, streaming=False)
    assert plain.retry_policy() == RetryPolicy()


@pytest.mark.parametrize(
    "parse, options, expected",
    [
        (
            lambda o: WriterOptions.parse(o, streaming=False),
            {"url": "http://h:8123", "table": "t", "batch_size": "many"},
            "option batch_size='many': expected an integer >= 1",
        ),
        (
            parse_kafka_options,
            {"bootstrap.servers": "h:9092", "subscribe": "t", "maxRecordsPerBatch": "many"},
            "kafka_py option maxRecordsPerBatch='many': expected an integer >= 1",
        ),
        (
            lambda o: WriterOptions.parse(o, streaming=False),
            {"url": "http://h:8123", "table": "t", "create_table": "maybe"},
            "option create_table='maybe': expected true or false",
        ),
        (
            parse_kafka_options,
            {"bootstrap.servers": "h:9092", "subscribe": "t", "failOnDataLoss": "maybe"},
            "kafka_py option failOnDataLoss='maybe': expected true or false",
        ),
    ],
)
def test_a_bad_value_is_refused_in_one_format_by_the_writer_and_by_kafka_py(
    parse: Any, options: dict[str, str], expected: str
) -> None:
    with pytest.raises(ConfigurationError) as e:
        parse(options)
    assert str(e.value).startswith(expected)


def test_a_bad_value_of_a_secret_option_is_not_shown() -> None:
    secret = OptionSpec("kafka.ssl.password", None, POSITIVE_INT, "", source="kafka_py", secret=True)
    with pytest.raises(ConfigurationError) as e:
        secret.parse("hunter2")
    assert str(e.value) == "kafka_py option kafka.ssl.password=***: expected an integer >= 1"


def test_an_unknown_option_of_either_source_names_close_matches_and_its_docs() -> None:
    with pytest.raises(ConfigurationError) as e:
        parse_kafka_options({"bootstrap.servers": "h:9092", "subscribe": "t", "maxOffsetPerTrigger": "5"})
    assert "maxoffsetpertrigger (did you mean maxOffsetsPerTrigger" in str(e.value) and "docs/kafka.md" in str(e.value)
    with pytest.raises(ConfigurationError) as e:
        WriterOptions.parse({"url": "http://h:8123", "table": "t", "retry.attempt": "5"}, streaming=False)
    assert "retry.attempt (did you mean retry.attempts" in str(e.value) and "docs/options.md" in str(e.value)
