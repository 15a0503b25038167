"""Rows into ClickHouse columns: the types (``chtypes``), what fits where (``column_fit``),
the target's description and schema check (``schema``), the value-by-value plan
(``convert``, ``values``), dead letters and the Arrow checksum.
"""
