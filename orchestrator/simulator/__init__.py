"""The embedded digital twin of `python -m sglang.launch_server` (SGLang 0.5.23).

`python -m orchestrator.simulator [every sglang serve flag] [simulator flags]` starts a server that
speaks SGLang's HTTP surface and log format, spawns one rank worker per TP rank that inherits its
environment (so the effective NCCL environment is observable in /proc and in NCCL's own
NCCL_DEBUG=INFO lines), and streams tokens in real time at the rate of a calibrated performance
model. The demo, CI and the tests run it instead of a GPU server, through the same code paths.

Pieces:
    __main__.py   `python -m orchestrator.simulator`: the server's entry point
    _rank_worker.py  one simulated tensor-parallel rank (stdlib only), started by ranks.py
    model.py      the performance model: pure equations, `evaluate`, `truth` (no I/O)
    algorithms.py each speculative algorithm's drafter (acceptance per position, draft cost, verify window:
                  tree, block, lookup) and its steps/top-k/draft tokens as SGLang resolves them
    profiles.py   hardware/model profiles from YAML/JSON (profiles/*.yaml built in)
    cost.py       real-scale seconds of one trial (load, warm-up, benchmark x repeats): `trial_cost`
    cli.py        SGLang's parser rebuilt from the 0.5.23 --help dump,
                  `params_from_launch` (argv + env -> model params: what a launch runs)
    spec_resolve.py  SGLang 0.5.23's resolution of the speculative flags per algorithm (`resolve`)
    engine.py     the scheduler loop: batching, real-time cycles, acceptance sampling, counters
    requests.py   a request (its counters, /generate meta_info), one verify of its draft, the prefix cache
    timing.py     what scales modelled time for a run: noise factors, jitter, drift
    adaptive_steps.py  --speculative-adaptive's per-slot EMA of the acceptance length and its log line
    tokens.py     the simulated model's greedy tokens and log-probabilities (shared with the model-backed
                  executor), near ties by reduction order, modelled corruption (LL128 forced on PCIe)
    api.py        the HTTP routes (Starlette)        telemetry.py  /metrics (prometheus_client)
    logs.py       SGLang's log lines                 ranks.py      rank worker processes
    failures.py   the text real failures print      faults.py     fault injection specs
    tuner_plugin.py  NCCL's tuner plugin loader and ext-tuner/example (rule file -> ranks' lines and timing)
    server.py     start-up, serving, shutdown

Simulator flags (never abbreviated, unlike SGLang's):
    --hardware-profile NAME|PATH   default pcie-rtxpro6000-x8 (also: pcie-rtxpro6000-x8-turin, h200-nvlink)
    --model-profile NAME|PATH      default kimi-k2.5
    --sim-seed INT                 seeds the run-to-run noise factor and acceptance sampling
    --sim-noise FRACTION           run-to-run multiplicative noise on cycle time (default 0.03);
                                   per-cycle jitter is a quarter of it; 0 makes timing exact
    --sim-noise-prefill-correlation R  how far prefill (TTFT) shares the run's decode noise, in [0, 1]
                                   (default 1: one speed for the whole run; 0: its own draw)
    --sim-drift FRACTION_PER_HOUR  host slow-down per hour since --sim-drift-epoch (default 0)
    --sim-drift-epoch UNIX_TS      shared by the server processes of one sweep
    --sim-time-scale FRACTION      sleep this fraction of the model profile's real load + graph-capture
                                   seconds at start-up (default 0: fast starts; `cost.trial_cost` keeps
                                   the real-scale accounting)
    --sim-fault SPEC               repeatable; also SWEEP_SIM_FAULTS="SPEC;SPEC"

Fault specs (details in faults.py):
    never_ready | slow_start=SECONDS | crash_after_tokens=N | hang_after_tokens=N | nccl_hang | nccl_hang_when=VAR:VALUE[,...]
    | oom_above_draft_tokens=N | env_drop | draft_wiring_broken
A port already in use fails like uvicorn: "[Errno 98] error while attempting to bind on address
('127.0.0.1', P): address already in use", exit 1.
"""

from orchestrator.simulator.cli import params_from_launch
from orchestrator.simulator.cost import TrialCost, trial_cost
from orchestrator.simulator.faults import Faults, parse_faults
from orchestrator.simulator.model import (
    AllReduceChoice,
    HardwareProfile,
    ModelProfile,
    NcclSettings,
    Prediction,
    Ranked,
    evaluate,
    nccl_all_reduce,
    truth,
)
from orchestrator.simulator.profiles import ProfileError, load_hardware, load_model

__all__ = [
    "AllReduceChoice",
    "Faults",
    "HardwareProfile",
    "ModelProfile",
    "NcclSettings",
    "Prediction",
    "ProfileError",
    "Ranked",
    "TrialCost",
    "evaluate",
    "load_hardware",
    "load_model",
    "nccl_all_reduce",
    "params_from_launch",
    "parse_faults",
    "trial_cost",
    "truth",
]
