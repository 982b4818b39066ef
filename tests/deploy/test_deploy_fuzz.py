"""No content of any env file executes anything: hostile values (command substitutions, backquotes, `;`,
newlines, quotes, expansions) either arrive literally where they were meant to go or are refused with a
message, through every format the entrypoint reads and through the entrypoint process itself."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from deploy_helpers import make_config, run_entrypoint
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.results import entrypoint, export, formats

MARKER_DIR = Path(tempfile.mkdtemp(prefix="h5fuzz"))
atexit.register(
    shutil.rmtree, MARKER_DIR, True
)  # made at import (the strategies name it): every process that imports it removes it
MARKER = MARKER_DIR / "pwned"
FRAGMENTS = [
    f"$(touch {MARKER})",
    f"`touch {MARKER}`",
    f"; touch {MARKER}",
    f"&& touch {MARKER}",
    f"| touch {MARKER}",
    f"\ntouch {MARKER}\n",
    "$HOME",
    "${PATH}",
    "'",
    '"',
    "\\",
    "\n",
    "\r",
    "#",
    " ",
    "\t",
    "=",
    "[",
    "]",
    "{",
    "}",
    ",",
    "export ",
    "SGLANG_SWEEP_ARGS_JSON=",
    "NCCL_ALGO=Tree",
    "--port",
    "\x00",
    "é",
    "\u2028",
]
hostile = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=4)), max_size=6).map("".join)
FUZZ = settings(
    deadline=None,
    database=None,
    derandomize=True,
    max_examples=300,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture(autouse=True)
def _no_marker():
    MARKER.unlink(missing_ok=True)
    yield
    assert not MARKER.exists(), "an env file's content was executed"


def _read_back(fmt: str, text: str) -> tuple[dict[str, str], list[str]]:
    if fmt == "env":
        return export.split_args(export.parse_env(text))
    if fmt == "docker-env":
        return formats.deployment(formats.parse_docker_env(text), whole_file=True)
    return formats.deployment(formats.parse_k8s(text), whole_file=True)


@FUZZ
@given(proto=hostile, other=hostile, arg=hostile, fmt=st.sampled_from(["env", "docker-env", "k8s"]))
def test_hostile_values_round_trip_literally_or_are_refused(proto: str, other: str, arg: str, fmt: str) -> None:
    config = make_config(env={"NCCL_PROTO": proto, "OTHER": other}, args=["--x", arg, "--tp-size", "8"])
    try:
        text = formats.render_for(config, fmt)
    except ValueError as e:
        # Only what the format cannot hold is refused, and the message says which variable.
        breaks = "\n\r\x00" + ("\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029" if fmt == "env" else "")
        assert any(c in v for v in (proto, other, arg) for c in breaks), e
        assert str(e).startswith("env value of"), e
        return
    assert _read_back(fmt, text) == ({"NCCL_PROTO": proto, "OTHER": other}, ["--x", arg, "--tp-size", "8"])


@FUZZ
@given(value=hostile, arg=hostile, fmt=st.sampled_from(["env", "docker-env"]))
def test_entrypoint_passes_hostile_values_literally(value: str, arg: str, fmt: str) -> None:
    config = make_config(env={"NCCL_PROTO": value}, args=["--served-model-name", arg])
    try:
        text = formats.render_for(config, fmt)
    except ValueError:
        return
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "champion.env"
        with open(path, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        environ = {
            "PATH": os.environ["PATH"],
            "CHAMPION_ENV": str(path),
            "MODEL_PATH": "/m",
            "SGLANG_PYTHON": sys.executable,
        }
        try:
            argv, env, _ = entrypoint.launch(environ)
        except entrypoint.DeployError as e:
            # A word that starts with '-' is an option to SGLang's parser (--port & co. by chance, or no
            # flag at all): refused by name, not run.
            assert arg.startswith("-"), e
            return
    assert argv == [
        sys.executable,
        "-m",
        "sglang.launch_server",
        "--model-path",
        "/m",
        "--host",
        "0.0.0.0",
        "--port",
        "30000",
        "--served-model-name",
        arg,
    ]
    assert env["NCCL_PROTO"] == value


@FUZZ
@given(lines=st.lists(hostile, max_size=6), fmt=st.sampled_from(["env", "docker-env", None]))
def test_hostile_file_contents_are_read_as_data(lines: list[str], fmt: str | None) -> None:
    """Arbitrary file contents: refused with a message or read; never run (checked by the marker)."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "champion.env"
        with open(path, "w", encoding="utf-8", errors="surrogatepass", newline="") as f:
            f.write("\n".join(lines))
        environ = {
            "PATH": os.environ["PATH"],
            "CHAMPION_ENV": str(path),
            "MODEL_PATH": "/m",
            "SGLANG_PYTHON": sys.executable,
            **({"CHAMPION_FORMAT": fmt} if fmt else {}),
        }
        try:
            entrypoint.launch(environ)
        except entrypoint.DeployError as e:
            assert str(e)


@FUZZ
@given(
    environment=st.dictionaries(
        st.sampled_from(["NCCL_PROTO", "NCCL_ALGO", "SGLANG_SWEEP_ENV_NAMES", "SGLANG_SWEEP_ARGS_JSON", "OTHER"]),
        hostile,
    )
)
def test_hostile_container_environment_is_read_as_data(environment: dict[str, str]) -> None:
    """`docker run --env-file` / envFrom: the variables arrive in the environment; still only data."""
    environ = {
        "PATH": os.environ["PATH"],
        "MODEL_PATH": "/m",
        "SGLANG_PYTHON": sys.executable,
        **environment,
    }
    with tempfile.TemporaryDirectory() as folder:
        image = Path(folder) / "image-env.json"
        image.write_text(json.dumps({"PATH": os.environ["PATH"], "SGLANG_PYTHON": sys.executable}))
        try:
            argv, env, _ = entrypoint.launch(environ, ["--image-env", str(image)])
        except entrypoint.DeployError as e:
            assert str(e)
            return
    assert "SGLANG_SWEEP_ARGS_JSON" not in env and argv[:3] == [sys.executable, "-m", "sglang.launch_server"]


HOSTILE_FILES = [
    f"SGLANG_SWEEP_ARGS=$(touch {MARKER})\n",
    f"SGLANG_SWEEP_ARGS=`touch {MARKER}`\n",
    f"SGLANG_SWEEP_ARGS='--tp-size 8'; touch {MARKER}\n",
    f"touch {MARKER}\nSGLANG_SWEEP_ARGS=--tp-size\n",
    f'export NCCL_PROTO="$(touch {MARKER})"\nSGLANG_SWEEP_ARGS=\n',
    f'SGLANG_SWEEP_ENV_NAMES=NCCL_PROTO\nNCCL_PROTO=$(touch {MARKER})\nSGLANG_SWEEP_ARGS_JSON=["--served-model-name","`touch {MARKER}`"]\n',
    f'SGLANG_SWEEP_ENV_NAMES=\nSGLANG_SWEEP_ARGS_JSON=["--x"]; touch {MARKER}\n',
]


# ids by position: the texts hold a temporary path, and pytest-xdist workers must collect the same ids
@pytest.mark.parametrize("text", HOSTILE_FILES, ids=[f"file{i}" for i in range(len(HOSTILE_FILES))])
def test_entrypoint_process_never_runs_file_content(tmp_path: Path, text: str) -> None:
    path = tmp_path / "champion.env"
    path.write_text(text)
    proc, record = run_entrypoint(tmp_path, {"MODEL_PATH": "/m", "CHAMPION_ENV": str(path)})
    assert "Traceback" not in proc.stderr
    if record is None:
        assert proc.returncode == 2 and proc.stderr.startswith("serve-champion: "), proc.stderr
    else:
        # Read, not run: the words arrive as they were written.
        assert f"`touch {MARKER}`" in record["argv"] or record["env"].get("NCCL_PROTO") == f"$(touch {MARKER})"


def test_a_real_shell_would_have_run_them(tmp_path: Path) -> None:
    """The marker check can see an execution: sourcing the hostile file in a shell does create it."""
    path = tmp_path / "champion.env"
    path.write_text(HOSTILE_FILES[0])
    subprocess.run(["sh", "-c", f". {path}"], check=False, timeout=30)
    assert MARKER.exists()
    MARKER.unlink()
