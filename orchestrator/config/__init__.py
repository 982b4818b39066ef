"""What the user wrote and what it means to SGLang (pure: no processes, no network).

- `experiment`: the experiment models, loading and validation (`load`, `SweepSpec`); one message per mistake;
  `sections` holds the models, `loading` the reading and the checks that span sections.
- `space`: the search-space models and the pure walks over a space (order of its knobs, every point).
- `knobs`: the typed catalogue of every knob (NCCL variables, SGLang flags) and the env allow-list.
- `flags`: SGLang's flag tables per version (`launch_server --help`, flags a knob emits, flags the sweep sets).
- `eagle`: the rules before launch in one call (`infeasible`: the algorithm's, then the all-reduce backend's),
  answering with a typed `Infeasible(rule, detail)`.
- `speculation`: the speculative algorithms (one class each: flags, draft model, rules, simulator drafter,
  how acceptance is read); `speculation_rules`: SGLang 0.5.23's rules as pure functions (`Rule`, `Infeasible`).
- `backend_rule`: the all_reduce_backend's rule before launch (a backend the host or model cannot take).
- `allreduce`: which backend carries each message class, as SGLang 0.5.23 decides it (`allreduce_facts`: the
  backends, host, model and path it works on); `commplan`: what `sweep plan` says of it.
- `adaptive`: the `--speculative-adaptive-config` JSON as 0.5.23 reads it.
- `render`: knob values -> SGLang flags (as data) and environment.
- `correctness`: promotion.correctness, the correctness gate's settings; `durations`: '8h', '30m' as seconds;
  `fields`: field types with finite ranges and text without control characters; `messages`: pydantic's
  errors in the user's words; `yamlfile`: bounded reading of the user's YAML.
"""

__all__ = ["eagle", "experiment", "flags", "knobs", "render", "space"]
