"""The overnight loop.

- `driver`: the sweep: work directory, resume, scheduling, recording, promotion; `status_report`.
"""
