"""Fuzz: mutated experiment files and search spaces (tests/config/hostile_mutations.py) through the
loader, the space census and the launch plan, in one child process under a memory limit with every
call under a CPU-time limit (and a generous wall-time one for a call that blocks): no traceback, no hang,
and nothing wrong accepted. The limits only tell a call that never ends (recorded as a hang) from one that
does: CPU time, because a loaded machine stretches the wall time of a call, not the CPU it needs. How fast
the loader answers is bench/fuzz_experiments.py's to measure, not this test's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import json, resource, signal, sys, tempfile
from pathlib import Path
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
sys.path.insert(0, sys.argv[1])
from hostile_mutations import materialize, mutations
from orchestrator.config import experiment
from orchestrator.errors import SpecError
from orchestrator.search import space as sp
from orchestrator.trial import plan as planner

class Hang(BaseException):  # no `except Exception` on the loader's path can swallow it
    pass

def alarm(signum, frame):
    raise Hang()

signal.signal(signal.SIGALRM, alarm)
signal.signal(signal.SIGPROF, alarm)
found = {"clean_error": 0, "accepted": 0, "hang": [], "traceback": [], "accepted_wrong": []}
with tempfile.TemporaryDirectory() as tmp:
    for i, m in enumerate(mutations(seed=int(sys.argv[2]), sample=int(sys.argv[3]))):
        exp = materialize(m, Path(tmp) / str(i))
        signal.setitimer(signal.ITIMER_PROF, 5)  # CPU seconds: a loop that never ends
        signal.alarm(300)  # wall seconds: a call that blocks without computing
        try:
            spec = experiment.load(exp)
            sp.census(spec.space)
            planner.make(spec, sp.baseline_params(spec.space), port=spec.server.port_range[0], seed=0)
            kind = "accepted_wrong" if m.must_refuse else "accepted"
        except SpecError:
            kind = "clean_error"
        except Hang:
            kind = "hang"
        except BaseException as exc:
            kind = "traceback"
            m = type(m)(f"{m.name}: {type(exc).__name__}: {str(exc)[:200]}", m.must_refuse, "")
        finally:
            signal.setitimer(signal.ITIMER_PROF, 0)
            signal.alarm(0)
        if isinstance(found[kind], list):
            found[kind].append(m.name)
        else:
            found[kind] += 1
print(json.dumps(found))
"""


def test_mutated_experiments_get_one_clean_answer_each() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(ROOT / "tests" / "config"), "11", "400"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1500,
    )  # a hang guard
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found["hang"] == []
    assert found["traceback"] == []
    assert found["accepted_wrong"] == []
    assert found["clean_error"] > 150 and found["accepted"] > 15
