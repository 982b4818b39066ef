"""Where results are recorded (the only MLflow importer).

- `tracker`: runs, outbox, registry.
"""
