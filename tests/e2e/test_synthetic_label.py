"""Acceptance measured on the builtin generator's synthetic prompts is labelled synthetic wherever it is shown
(issue 35): `sweep plan`'s text, the trial line `sweep run` prints, the trial's MLflow run (tag
sweep.acceptance, read back from the sqlite store) and report.html. The sweep is the real 6-trial demo sweep
(conftest.py finished_sweep: EAGLE-3 in the space, no benchmark.dataset_path); real text is labelled so, and
`sweep plan` warns of nothing once a dataset is set."""

from __future__ import annotations

import re
from pathlib import Path

from e2e_helpers import demo_experiment, mlflow_runs, sweep, write_experiment

from orchestrator.records import Metrics

LINE = re.compile(r"✔ trial +\d+ .*accept len (\d+\.\d\d)(?: \(([^)]*)\))?")


def test_the_run_line_mlflow_and_report_label_synthetic_acceptance(finished_sweep) -> None:
    wd, proc = finished_sweep
    lines = LINE.findall(proc.stdout)
    assert lines, proc.stdout  # the demo's space speculates: some trial printed its accept length
    assert all(label == "synthetic prompts" for _, label in lines), lines
    speculating = [  # trial runs that measured an acceptance (a failed launch has none to label)
        r for runs in mlflow_runs(wd, "e2e").values() for r in runs if "accept_length" in r.data.metrics
    ]
    assert speculating
    assert {r.data.tags.get("sweep.acceptance") for r in speculating} == {"synthetic prompts"}
    page = (wd / "report.html").read_text(encoding="utf-8")
    assert "id='synthetic'" in page and "measured on synthetic prompts" in page
    assert '<td class="">synthetic prompts</td>' in page  # each speculating trial's row, beside accept_length


def test_sweep_plan_warns_on_synthetic_prompts_and_not_on_real_text(tmp_path: Path) -> None:
    synthetic = write_experiment(tmp_path, demo_experiment(name="plan-synthetic"), "synthetic.yaml")
    out = sweep("plan", str(synthetic), cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "synthetic acceptance: benchmark.dataset_path is not set" in out.stdout
    dataset = tmp_path / "prompts.jsonl"
    dataset.write_text('{"prompt": "Explain how a transformer decodes text."}\n')
    data = demo_experiment(name="plan-real")
    data["benchmark"]["dataset_path"] = str(dataset)
    real = sweep("plan", str(write_experiment(tmp_path, data, "real.yaml")), cwd=tmp_path)
    assert real.returncode == 0, real.stdout + real.stderr
    assert "synthetic" not in real.stdout


def test_the_label_follows_the_prompts_source() -> None:
    spec = {"accept_length": 2.5, "decode_tok_s": 100.0, "output_tok_s": 100.0}
    assert Metrics(**spec, sources={"prompts": "synthetic: the builtin generator's 25-word list"}).acceptance_label == (
        "synthetic prompts"
    )
    assert Metrics(**spec, sources={"prompts": "real text: /data/s.json"}).acceptance_label == "real text"
    assert (
        Metrics(decode_tok_s=100.0, output_tok_s=100.0, sources={"prompts": "synthetic: x"}).acceptance_label is None
    )  # no acceptance
