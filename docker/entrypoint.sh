#!/bin/sh
exec "${SERVE_CHAMPION_PYTHON:-python3}" -m orchestrator.results.entrypoint "$@"
