"""What the server ran with is what every record shows (issue 18): at top-k 1 SGLang forces draft
tokens = steps + 1 (sglang/srt/server_args.py, ServerArgs._handle_speculative_decoding: "speculative_eagle_topk
== 1 ... speculative_num_draft_tokens = speculative_num_steps + 1"; config.eagle.effective is our copy of
the rule), so a space leaves draft tokens out there; the trial's MLflow row, its outcome.json and the
sweep's results.csv carry the value the server was launched with, not "unset"."""

from __future__ import annotations

import json

import pandas as pd
import yaml
from e2e_helpers import demo_experiment, write_experiment
from mlflow.tracking import MlflowClient
from mlflow_fixtures import copy_store, sqlite_store_template  # noqa: F401 (fixture)

from orchestrator.config import experiment as spec_mod
from orchestrator.sweep.driver import Sweep
from orchestrator.testing import ModelExecutor


def test_a_top_k_1_trial_shows_the_draft_tokens_it_was_launched_with(tmp_path, sqlite_store_template):
    space = tmp_path / "chain.yaml"
    space.write_text(
        yaml.safe_dump(
            {
                "name": "chain",
                "params": {
                    "speculative_algorithm": {"choices": [None, "EAGLE3"]},
                    "speculative_num_steps": {"choices": [4], "when": {"speculative_algorithm": "EAGLE3"}},
                    "speculative_eagle_topk": {"choices": [1, 4], "when": {"speculative_algorithm": "EAGLE3"}},
                    "speculative_num_draft_tokens": {"choices": [8], "when": {"speculative_eagle_topk": [4]}},
                },
            }
        )
    )
    data = demo_experiment(
        name="chain",
        search_space=[str(space)],
        budget={"trials": 3, "concurrent_trials": 1},
        promotion={"max_rounds": 0},
    )
    spec = spec_mod.load(write_experiment(tmp_path, data))
    wd = tmp_path / "wd"
    copy_store(sqlite_store_template, wd)
    Sweep(spec, wd, executor=ModelExecutor(1)).run()

    outcomes = [json.loads(p.read_text()) for p in sorted((wd / "trials").glob("*/outcome.json"))]
    chain = next(o for o in outcomes if o["params"].get("speculative_eagle_topk") == 1)
    assert chain["params"]["speculative_num_draft_tokens"] is None  # the proposal leaves it to SGLang's rule
    assert chain["effective_params"]["speculative_num_draft_tokens"] == 5
    assert "--speculative-num-draft-tokens" in chain["launch"]["argv"]
    launched = chain["launch"]["argv"][chain["launch"]["argv"].index("--speculative-num-draft-tokens") + 1]
    assert launched == "5"

    client = MlflowClient(tracking_uri=f"sqlite:///{wd / 'mlflow.db'}")
    exp = client.get_experiment_by_name("chain")
    runs = client.search_runs([exp.experiment_id], filter_string=f"tags.`sweep.trial_number` = '{chain['number']}'")
    (run,) = [r for r in runs if r.data.params.get("speculative_eagle_topk") == "1"]
    assert run.data.params["speculative_num_draft_tokens"] == "5"

    parent = next(r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("sweep.kind") == "sweep")
    csv = client.download_artifacts(parent.info.run_id, "results.csv", str(tmp_path))
    table = pd.read_csv(csv)
    row = table[table["trial"] == chain["number"]].iloc[0]
    assert int(row["speculative_num_draft_tokens"]) == 5
