"""What a user writes comes back from the work directory (issue 21, item 5): experiment.json keeps every
environment value as the string a rank receives, and every later reader (status, report, export, resume)
reads it back. An integer knob written as an integer (NCCL_BUFFSIZE: 16777216) passed validate and ran, but
its stored string failed the integer check on the way back: 'written by another version of sweep'."""

from __future__ import annotations

import json

import pytest
from e2e_helpers import demo_experiment, nccl_space, write_experiment

from orchestrator.config import experiment as spec_mod
from orchestrator.errors import SpecError

# Every value type an experiment may give server.env: an integer for an integer knob, a power of two,
# a zero, an integer for a 0/1 knob, an integer written as a string, an integer for a variable without a knob.
ENV = {"NCCL_BUFFSIZE": 16777216, "NCCL_P2P_DISABLE": 0, "NCCL_MAX_CTAS": 16, "SGLANG_HEALTH_CHECK_TIMEOUT": "60",
       "NCCL_NTHREADS": 256, "NCCL_DEBUG": "INFO"}
FLAGS = {"mem-fraction-static": 0.85, "enable-metrics": True, "cuda-graph-max-bs-decode": 8,
         "attention-backend": "triton", "chunked-prefill-size": -1}


def experiment(tmp_path, name: str = "roundtrip", **overrides):
    data = demo_experiment(name=name, search_space=[str(nccl_space(tmp_path, ["Ring", "Tree"]))], **overrides)
    data["server"]["env"].update(ENV)
    data["server"]["flags"] = dict(FLAGS)
    return data


def test_every_value_type_reads_back_from_experiment_json(tmp_path):
    spec = spec_mod.load(write_experiment(tmp_path, experiment(tmp_path)))
    stored = json.loads(json.dumps(spec.model_dump(mode="json")))
    assert stored["server"]["env"]["NCCL_BUFFSIZE"] == "16777216"  # what the ranks receive
    back = spec_mod.SweepSpec.model_validate(stored)
    assert back == spec
    assert back.server.flags == FLAGS and type(back.server.flags["cuda-graph-max-bs-decode"]) is int


@pytest.mark.parametrize(("name", "value", "message"), [
    ("NCCL_BUFFSIZE", "16M", "NCCL_BUFFSIZE must be an integer, but got '16M'"),
    ("NCCL_BUFFSIZE", "3000000", "must be a positive power of two, but got 3000000"),
    ("NCCL_MAX_CTAS", "65", "must be in [1, 64], but got 65"),
    ("NCCL_P2P_DISABLE", True, "must be a string or an integer, but got True"),
    ("NCCL_BUFFSIZE", 1.5, "must be a string or an integer, but got 1.5"),
])
def test_a_value_that_cannot_round_trip_is_refused_at_validate(tmp_path, name, value, message):
    data = experiment(tmp_path)
    data["server"]["env"][name] = value
    with pytest.raises(SpecError) as err:
        spec_mod.load(write_experiment(tmp_path, data))
    assert message in str(err.value) and name in str(err.value)
