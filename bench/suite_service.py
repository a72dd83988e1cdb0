"""Service: API latency under load, measured by ``bench/service_load.py`` (owned by the service API work).

That script prints one JSON object as its last stdout line; it is passed through to the results
unchanged. ``--quick`` and ``--json`` are passed when its ``--help`` lists them.
"""

from __future__ import annotations

import subprocess
from typing import Any

from harness import Context, log, run_json

__all__ = ["run"]


def run(ctx: Context) -> dict[str, Any]:
    script = ctx.repo / "bench" / "service_load.py"
    if not script.exists():
        return {"skipped": "bench/service_load.py is not there yet: no service numbers in this run."}
    help_text = subprocess.run(
        [ctx.ferry_python, str(script), "--help"], capture_output=True, text=True, timeout=120
    ).stdout
    cmd = [ctx.ferry_python, str(script)]
    cmd += ["--json"] if "--json" in help_text else []
    cmd += ["--quick"] if ctx.quick and "--quick" in help_text else []
    log(f"service: {' '.join(cmd[1:])}")
    res = run_json(cmd, ctx.env(), timeout=600)
    if "error" in res:
        return {"error": res["error"]}
    return {"result": res, "command": " ".join(["python", *cmd[1:]])}
