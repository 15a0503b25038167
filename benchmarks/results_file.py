"""Where every benchmark writes its JSON result (``benchmarks/results/*.json``)."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any, Callable, Mapping


def write_result(path: str | Path, doc: Mapping[str, Any]) -> Path:
    """Write ``doc`` as indented JSON to ``path``, creating its directory; return the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return out


def machine(**extra: Any) -> dict[str, Any]:
    """What a result was measured on: cores, Python, and the load average (1, 5, 15 min)
    when the result is written, so a loaded run can be told from a quiet one."""
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        **extra,
    }


def save_figure(fig: Any, path: str | Path) -> Path:
    """Write a matplotlib figure as the PNG beside a result (laid out, 110 dpi) and close it."""
    import matplotlib.pyplot as plt

    out = Path(path)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def run_on_server(url: str | None, bench: Callable[[str], dict[str, Any]], json_path: str | None) -> dict[str, Any]:
    """``bench`` on ``url``, or on a private embedded stack when None; printed, and written to ``json_path``."""
    if url:
        result = bench(url)
    else:
        import tempfile

        from server_patches.stack import running_stack

        with tempfile.TemporaryDirectory(prefix="ctx-bench-stack-") as d, running_stack(d) as stack:
            result = bench(stack.clickhouse_url)
    print(json.dumps(result, indent=2))
    if json_path:
        write_result(json_path, result)
    return result
