"""Issue 38 (hardening, round three), items 1, 3, 4 and 5 of its findings, and issue 37 item 6: the worker
image's entrypoint, run as a real process, loads only what SGLang needs.

- a configuration never names code: SGLANG_NCCL_SO_PATH (SGLang opens it with ctypes.CDLL),
  NCCL_TUNER_PLUGIN, NCCL_NET_PLUGIN and the like come only from the deployment (the container's own
  environment, or `serve-champion --path-env NAME=VALUE`);
- flags are SGLang's own, spelt whole (argparse would take --model-pat for --model-path), never the ones
  the entrypoint sets or that run code;
- every bad byte gets one message and exit 2 (a NUL, a lone surrogate, nesting, 128 KiB values);
- with the configuration in the environment, a PATH it does not list is refused;
- the site's NCCL variables (NCCL_SOCKET_IFNAME, NCCL_IB_*, NCCL_NET_*) stay unless --drop-site-env.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from deploy_helpers import PRODUCTION_ARGS, make_config, run_entrypoint, sglang_argv

from orchestrator.config import flags
from orchestrator.results import deployable, entrypoint, export, formats

MODEL = "/models/m"
REPO = Path(__file__).resolve().parents[2]
GOOD = formats.render_for(make_config(), "docker-env")


def _file(tmp_path: Path, env: dict[str, str], args: list[str], fmt: str = "docker-env") -> Path:
    """A configuration file that sets exactly `env` and `args`, written by hand (as an attacker would)."""
    path = tmp_path / "champion.env"
    if fmt == "env":
        lines = [f"{k}={v}" for k, v in env.items()] + ["SGLANG_SWEEP_ARGS=" + shlex.quote(shlex.join(args))]
    else:
        lines = [f"{k}={v}" for k, v in env.items()]
        lines += [f"{formats.ENV_NAMES_VAR}={','.join(env)}", f"{formats.ARGS_JSON_VAR}={json.dumps(args)}"]
    with open(path, "w", encoding="utf-8", errors="surrogatepass", newline="") as f:
        f.write("\n".join(lines) + "\n")
    return path


def _refused(tmp_path: Path, environ: dict[str, str], *extra: str, image: dict[str, str] | None = None) -> str:
    proc, record = run_entrypoint(tmp_path, {"MODEL_PATH": MODEL, **environ}, *extra, image=image)
    assert (proc.returncode, record) == (2, None), proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("serve-champion: "), proc.stderr
    return lines[0]


def _served(tmp_path: Path, environ: dict[str, str], *extra: str) -> tuple[dict, str]:
    proc, record = run_entrypoint(tmp_path, {"MODEL_PATH": MODEL, **environ}, *extra)
    assert proc.returncode == 0 and record is not None, proc.stderr
    return record, proc.stderr


# ---------------------------------------------------------------- 1. no path to code from a configuration


@pytest.mark.parametrize("fmt", ["docker-env", "env"])
@pytest.mark.parametrize("name", ["SGLANG_NCCL_SO_PATH", "NCCL_TUNER_PLUGIN", "NCCL_NET_PLUGIN", "LD_LIBRARY_PATH"])
def test_a_configuration_that_names_a_library_is_refused(tmp_path: Path, fmt: str, name: str) -> None:
    path = _file(tmp_path, {"NCCL_PROTO": "LL", name: "/tmp/evil.so"}, ["--tp-size", "8"], fmt)
    line = _refused(tmp_path, {"CHAMPION_ENV": str(path)})
    assert f"({fmt} format) sets {name}, which sweep export never writes" in line
    assert "never a path to code" in line and "--path-env NAME=VALUE" in line


def test_a_library_path_comes_from_the_deployment_or_the_entrypoint_flag(tmp_path: Path) -> None:
    path = tmp_path / "champion.env"
    path.write_text(GOOD)
    record, _ = _served(
        tmp_path,
        {"CHAMPION_ENV": str(path), "SGLANG_NCCL_SO_PATH": "/opt/nccl/lib/libnccl.so.2"},
        "--path-env",
        "NCCL_TUNER_PLUGIN=/opt/nccl/libnccl-tuner-example.so",
    )
    assert record["env"]["SGLANG_NCCL_SO_PATH"] == "/opt/nccl/lib/libnccl.so.2"
    assert record["env"]["NCCL_TUNER_PLUGIN"] == "/opt/nccl/libnccl-tuner-example.so"
    assert record["argv"] == sglang_argv(MODEL, *PRODUCTION_ARGS)  # the entrypoint's own option is not SGLang's


def test_path_env_takes_only_variables_that_name_code(tmp_path: Path) -> None:
    path = tmp_path / "champion.env"
    path.write_text(GOOD)
    line = _refused(tmp_path, {"CHAMPION_ENV": str(path)}, "--path-env", "NCCL_PROTO=LL")
    assert "--path-env takes NAME=VALUE for a variable that names code" in line


def test_the_entrypoints_own_options_are_no_sglang_flags() -> None:
    known = flags.known_flags(deployable.DEPLOY_SGLANG_VERSION) or frozenset()
    assert known and not set(entrypoint.OWN_OPTIONS) & known
    assert not [f for f in known for own in entrypoint.OWN_OPTIONS if f.startswith(own)]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model-pat", "/x"], "not a flag of SGLang 0.5.23 spelt whole (argparse would read it as --model-path)"),
        (["--hos", "1.2.3.4"], "not a flag of SGLang 0.5.23 spelt whole (argparse would read it as --host)"),
        (["--por", "1"], "not a flag of SGLang 0.5.23 spelt whole"),
        (["--model", "/x"], "sets --model, which the entrypoint sets from MODEL_PATH"),
        (["--model-path=/x"], "sets --model-path, which the entrypoint sets from MODEL_PATH"),
        (["--port=1"], "sets --port, which the entrypoint sets from PORT"),
        (["--trust-remote-code"], "sets --trust-remote-code, which runs the model repository's own Python code"),
        (["--enable-custom-logit-processor"], "runs logit processors that requests send as serialized Python"),
        (["--config", "/tmp/more-flags.yaml"], "reads more flags from a file, past this check"),
        (["--tp-size", "8", "--"], "holds '--', which is not a flag of SGLang 0.5.23"),
        (["--no-such-flag"], "holds '--no-such-flag', which is not a flag of SGLang 0.5.23"),
    ],
)
def test_flags_only_from_the_allow_list_matched_whole(tmp_path: Path, args: list[str], message: str) -> None:
    path = _file(tmp_path, {}, args)
    line = _refused(tmp_path, {"CHAMPION_ENV": str(path)})
    assert message in line, line


def test_values_and_negative_numbers_are_no_flags(tmp_path: Path) -> None:
    args = ["--tp-size", "8", "--served-model-name", "x y", "--random-seed", "-1", "--chat-template", "-"]
    record, _ = _served(tmp_path, {"CHAMPION_ENV": str(_file(tmp_path, {}, args))})
    assert record["argv"] == sglang_argv(MODEL, *args)


def test_the_deployment_may_still_pass_trust_remote_code_after_the_image_name(tmp_path: Path) -> None:
    path = tmp_path / "champion.env"
    path.write_text(GOOD)
    record, _ = _served(tmp_path, {"CHAMPION_ENV": str(path)}, "--trust-remote-code")
    assert record["argv"] == sglang_argv(MODEL, *PRODUCTION_ARGS, "--trust-remote-code")


def test_export_leaves_out_what_only_a_deployment_sets_and_says_so(tmp_path: Path) -> None:
    """Kimi's experiment sets trust-remote-code; a host may set SGLANG_NCCL_SO_PATH: the exported file leaves
    both out, names them in its header, and the entrypoint serves it."""
    config = make_config(
        env={"NCCL_PROTO": "LL", "SGLANG_NCCL_SO_PATH": "/opt/libnccl.so.2"},
        args=[
            "--tp-size",
            "8",
            "--trust-remote-code",
            "--custom-weight-loader",
            "pkg.load",
            "--mem-fraction-static",
            "0.85",
        ],
    )
    for fmt in ("docker-env", "env"):
        text = formats.render_for(config, fmt)
        assert (
            "left out, as only a deployment sets them (they load or run code): SGLANG_NCCL_SO_PATH=/opt/libnccl.so.2 "
            "--trust-remote-code --custom-weight-loader pkg.load"
        ) in text
        path = tmp_path / "champion.env"
        path.write_text(text)
        record, _ = _served(tmp_path, {"CHAMPION_ENV": str(path)})
        assert record["argv"] == sglang_argv(MODEL, "--tp-size", "8", "--mem-fraction-static", "0.85")
        assert "SGLANG_NCCL_SO_PATH" not in record["env"]
    assert formats.render_for(config, "sglang-args") == "--tp-size\n8\n--mem-fraction-static\n0.85\n"


# ---------------------------------------------------------------- 2. every bad byte: one message, exit 2


@pytest.mark.parametrize(
    ("env", "args", "message"),
    [
        ({"NCCL_PROTO": "L\0L"}, ["--tp-size", "8"], "the value of NCCL_PROTO holds a NUL byte"),
        ({}, ["--served-model-name", "a\0b"], "flag word 2 holds a NUL byte"),
        ({}, ["--served-model-name\0"], "flag word 1 holds a NUL byte"),
        ({}, ["--served-model-name", "\ud800"], "flag word 2 holds a lone surrogate '\\ud800'"),
        ({"NCCL_PROTO": "x" * (128 * 1024)}, [], "the value of NCCL_PROTO is 131083 bytes, more than the 131071"),
        ({}, ["--served-model-name", "y" * (128 * 1024)], "flag word 2 is 131072 bytes, more than the 131071"),
    ],
)
def test_a_bad_byte_in_a_value_or_flag_is_one_message(
    tmp_path: Path, env: dict[str, str], args: list[str], message: str
) -> None:
    path = tmp_path / "champion.env"
    lines = [f"{k}={v}" for k, v in env.items()]
    # json.dumps escapes the NUL and the surrogate (\u0000, \ud800): the file is valid UTF-8, the JSON holds them.
    lines += [f"{formats.ENV_NAMES_VAR}={','.join(env)}", f"{formats.ARGS_JSON_VAR}={json.dumps(args)}"]
    path.write_text("\n".join(lines) + "\n")
    assert message in _refused(tmp_path, {"CHAMPION_ENV": str(path)})


@pytest.mark.parametrize("where", ["file", "environment"])
def test_deeply_nested_json_is_one_message(tmp_path: Path, where: str) -> None:
    nested = "[" * 50_000 + "]" * 50_000  # far past json's recursion, within one variable's 128 KiB
    if where == "file":
        path = tmp_path / "champion.env"
        path.write_text(f"{formats.ENV_NAMES_VAR}=\n{formats.ARGS_JSON_VAR}={nested}\n")
        line = _refused(tmp_path, {"CHAMPION_ENV": str(path)})
    else:
        line = _refused(tmp_path, {formats.ENV_NAMES_VAR: "", formats.ARGS_JSON_VAR: nested})
    assert "SGLANG_SWEEP_ARGS_JSON is nested too deeply to read; it must be an unquoted JSON array of strings" in line


def test_export_refuses_what_no_process_can_be_given() -> None:
    for arg, why in (("a\0b", "holds a NUL byte"), ("\udc80", "holds a lone surrogate")):
        with pytest.raises(ValueError, match=f"SGLang argument 2 {why}"):
            formats.render_for(make_config(args=["--served-model-name", arg]), "docker-env")


# ---------------------------------------------------------------- 3. the argument file, read with mapfile


def _readme_recipe() -> list[str]:
    """The README's deploy recipe: its indented lines from `sweep export --format sglang-args` on."""
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("    sweep export --format sglang-args"))
    block = []
    for line in lines[start:]:
        if not line.startswith("    "):
            break
        block.append(line[4:])
    return block


def test_the_readmes_mapfile_recipe_keeps_every_argument_whole_and_literal(tmp_path: Path) -> None:
    """The README's recipe, run verbatim in bash on the files `sweep export` writes (the sglang-args one, one
    argument a line): the launcher gets each argument whole, a value with spaces and a `$(...)` as text."""
    marker = tmp_path / "pwned"
    args = ["--served-model-name", "two words", "--chat-template", f"$(touch {marker})", "--tp-size", "8", "--x", ""]
    config = make_config(env={"NCCL_PROTO": "LL"}, args=args)
    (tmp_path / "champion.args").write_text(formats.render_for(config, "sglang-args"))
    (tmp_path / "champion.env").write_text(formats.render_for(config, "env"))
    recipe = _readme_recipe()
    assert recipe[0].startswith("sweep export --format sglang-args -o champion.args")
    assert any(line.startswith("mapfile -t args < champion.args") for line in recipe)
    # `python` records its argv instead of starting SGLang; the export itself was done above.
    script = "\n".join(["python() { printf '%s\\0' \"$@\"; }", *recipe[1:]])
    proc = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, timeout=30, check=True)
    argv = proc.stdout.decode().split("\0")[:-1]
    assert argv == ["-m", "sglang.launch_server", "--model-path", "/models/Kimi-K2.5", "--port", "30000", *args]
    assert not marker.exists()


def test_the_argument_file_refuses_a_newline_in_an_argument() -> None:
    with pytest.raises(ValueError, match="argument 2 holds a newline or NUL"):
        export.render(make_config(args=["--served-model-name", "a\nb"]), "sglang-args")


# ---------------------------------------------------------------- 4. a PATH from an environment configuration


def _evil_python(tmp_path: Path) -> tuple[Path, Path]:
    evil = tmp_path / "evil"
    evil.mkdir()
    mark = tmp_path / "evil-ran"
    (evil / "python3").write_text(f"#!/bin/sh\ntouch {mark}\n")
    (evil / "python3").chmod(0o755)
    return evil, mark


def test_a_path_the_environment_configuration_does_not_list_is_refused(tmp_path: Path) -> None:
    """docker run --env-file with a file that adds PATH=... without listing it: not the image's, refused."""
    evil, mark = _evil_python(tmp_path)
    delivered = formats.parse_docker_env(GOOD)
    line = _refused(tmp_path, {**delivered, "PATH": f"{evil}:{os.environ['PATH']}", "SGLANG_PYTHON": "python3"})
    assert "the environment sets PATH=" in line and "unlike the image" in line
    assert "--path-env NAME=VALUE" in line
    assert not mark.exists()


def test_an_unlisted_library_in_an_environment_configuration_is_refused(tmp_path: Path) -> None:
    delivered = formats.parse_docker_env(GOOD)
    line = _refused(tmp_path, {**delivered, "NCCL_NET_PLUGIN": "/tmp/evil.so"})
    assert "the environment sets NCCL_NET_PLUGIN='/tmp/evil.so', unlike the image" in line


def test_an_environment_configuration_without_the_image_record_is_refused(tmp_path: Path) -> None:
    delivered = formats.parse_docker_env(GOOD)
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator.results.entrypoint", "--image-env", str(tmp_path / "missing.json")],
        env={"PATH": os.environ["PATH"], "MODEL_PATH": MODEL, **delivered},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "the variables that name code (PATH, LD_*, ...) must be the image's own" in proc.stderr


def test_the_image_record_is_written_at_build_and_read_back(tmp_path: Path) -> None:
    record = tmp_path / "image-env.json"
    environ = {"PATH": "/usr/local/bin:/usr/bin", "LD_LIBRARY_PATH": "/usr/local/cuda/lib64", "HOME": "/root"}
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator.results.entrypoint", "--record-image-env", str(record)],
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(record.read_text()) == {
        "LD_LIBRARY_PATH": "/usr/local/cuda/lib64",
        "PATH": "/usr/local/bin:/usr/bin",
    }


# ---------------------------------------------------------------- 5. the site's NCCL variables


SITE = {"NCCL_SOCKET_IFNAME": "eth0", "NCCL_IB_HCA": "mlx5_0", "NCCL_NET_GDR_LEVEL": "PHB", "NCCL_TOPO_FILE": "/t.xml"}


def test_the_sites_nccl_variables_are_kept_and_tuning_knobs_dropped(tmp_path: Path) -> None:
    path = tmp_path / "champion.env"
    path.write_text(GOOD)
    record, stderr = _served(tmp_path, {"CHAMPION_ENV": str(path), "NCCL_ALGO": "Tree", **SITE})
    assert {k: record["env"].get(k) for k in SITE} == SITE
    assert "NCCL_ALGO" not in record["env"]
    assert "dropped NCCL variables the configuration does not set: NCCL_ALGO" in stderr
    assert (
        "kept the site's NCCL variables: NCCL_IB_HCA, NCCL_NET_GDR_LEVEL, NCCL_SOCKET_IFNAME, NCCL_TOPO_FILE" in stderr
    )


def test_drop_site_env_drops_them_and_the_configuration_wins(tmp_path: Path) -> None:
    path = tmp_path / "champion.env"
    path.write_text(formats.render_for(make_config(env={"NCCL_IB_DISABLE": "1"}), "docker-env"))
    record, _ = _served(tmp_path, {"CHAMPION_ENV": str(path), "NCCL_IB_DISABLE": "0", **SITE})
    assert record["env"]["NCCL_IB_DISABLE"] == "1"  # the configuration sets it: its value, not the site's
    record, stderr = _served(tmp_path, {"CHAMPION_ENV": str(path), **SITE}, "--drop-site-env")
    assert not set(SITE) & set(record["env"]) and record["env"]["NCCL_IB_DISABLE"] == "1"
    assert "NCCL_SOCKET_IFNAME" in stderr and "kept the site's" not in stderr
