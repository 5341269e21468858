"""custody_outcomes: a pytest plugin that writes one JSON line per test outcome, as it happens.

Loaded by the differential harness (`foreign_tests.py`) with `-p custody_outcomes`; writes to the
file named by CUSTODY_OUTCOMES_FILE. Each line is flushed at once, so a test that kills the
process (a crash in a driver) still leaves a "start" line without an outcome: the harness reports
it as a crash instead of losing the whole file.

Lines: {"event": "start", "nodeid": ...} when a test begins; {"event": "outcome", "nodeid": ...,
"outcome": passed|failed|error|skipped|xfailed|xpassed, "message": ...} when its teardown ends;
{"event": "outcome", "nodeid": <file>, "outcome": "error", "collect": true, ...} for a file that
fails to collect.
"""

import json
import os

_FILE = None
_PHASES = {}


def _write(record):
    global _FILE
    path = os.environ.get("CUSTODY_OUTCOMES_FILE")
    if not path:
        return
    if _FILE is None:
        _FILE = open(path, "a", encoding="utf-8")
    _FILE.write(json.dumps(record) + "\n")
    _FILE.flush()


def _message(report):
    text = getattr(report, "longreprtext", "") or ""
    if report.skipped and isinstance(report.longrepr, tuple) and len(report.longrepr) == 3:
        text = str(report.longrepr[2])
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("E ")]
    line = errors[-1] if errors else (lines[-1] if lines else "")
    return line[:300]


def pytest_runtest_logstart(nodeid, location):
    _write({"event": "start", "nodeid": nodeid})


def pytest_runtest_logreport(report):
    phases = _PHASES.setdefault(report.nodeid, {})
    phases[report.when] = report
    if report.when != "teardown":
        return
    del _PHASES[report.nodeid]
    setup, call, teardown = phases.get("setup"), phases.get("call"), report
    xfail = any(hasattr(r, "wasxfail") for r in (setup, call) if r is not None)
    if setup is not None and setup.failed:
        outcome, why = "error", setup
    elif setup is not None and setup.skipped:
        outcome, why = ("xfailed" if xfail else "skipped"), setup
    elif call is not None and call.failed:
        outcome, why = "failed", call
    elif call is not None and call.skipped:
        outcome, why = ("xfailed" if xfail else "skipped"), call
    elif call is not None and xfail:
        outcome, why = "xpassed", call
    else:
        outcome, why = "passed", call
    if teardown.failed and outcome in ("passed", "skipped", "xfailed", "xpassed"):
        outcome, why = "error", teardown
    _write({"event": "outcome", "nodeid": report.nodeid, "outcome": outcome,
            "message": _message(why) if why is not None and outcome != "passed" else ""})


def pytest_collectreport(report):
    if report.failed:
        _write({"event": "outcome", "nodeid": report.nodeid, "outcome": "error", "collect": True,
                "message": _message(report)})
