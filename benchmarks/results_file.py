"""Where every benchmark writes its JSON result (``benchmarks/results/*.json``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping


def write_result(path: str | Path, doc: Mapping[str, Any]) -> Path:
    """Write ``doc`` as indented JSON to ``path``, creating its directory; return the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return out
