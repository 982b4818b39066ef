#!/bin/sh
exec "${SERVE_CHAMPION_PYTHON:-python3}" -I -m orchestrator.results.entrypoint "$@"
