"""scripts/commit-msg, the hook `make hooks` installs: run as git runs it, on sample messages.

A subject of at most 72 characters without a closing full stop, and a blank line before the body; comments
and the scissors' tail are not part of the message; a refusal says what is wrong and how to fix it. The
last test installs it into a throwaway repository and lets git itself run it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HOOK = REPO / "scripts" / "commit-msg"


def run_hook(tmp_path: Path, message: str) -> subprocess.CompletedProcess[str]:
    msg = tmp_path / "COMMIT_EDITMSG"
    msg.write_text(message, encoding="utf-8")
    return subprocess.run(
        [sys.executable, str(HOOK), str(msg)], capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.parametrize(
    "message",
    [
        "Add the commit-msg hook\n",
        "Add the commit-msg hook\n\nSubjects over 72 characters made git log --oneline unreadable.\n",
        "x" * 72 + "\n",
        "Fix the gate's bound\n\n# Please enter the commit message for your changes.\n# On branch main\n",
        "Keep one result per benchmark\n# ------------------------ >8 ------------------------\n" + "diff " * 40,
        "\n\nLeading blank lines are dropped by git\n\nbody\n",
        "Merge branch 'main' of somewhere with a very long name that goes well past seventy-two chars.\n",
        "# only comments: git refuses an empty message itself\n",
    ],
)
def test_a_readable_message_passes(tmp_path, message):
    proc = run_hook(tmp_path, message)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("y" * 73 + "\n", "the subject is 73 characters (at most 72)"),
        ("Add the hook.\n", "ends with a full stop"),
        ("Add the hook\nand a body on line 2\n", "leave line 2 blank"),
        (
            "docs + results: the nights rerun at dd3c0c9 (one noise rule for every interval): 4% noise 19/20.\nbody\n",
            "characters (at most 72)",
        ),
    ],
)
def test_a_message_git_log_cannot_show_is_refused_with_the_fix(tmp_path, message, expected):
    proc = run_hook(tmp_path, message)
    assert proc.returncode == 1
    assert expected in proc.stderr
    assert "git commit -e -F .git/COMMIT_EDITMSG" in proc.stderr


def test_every_problem_is_named_at_once(tmp_path):
    proc = run_hook(tmp_path, "z" * 80 + ".\nbody right under it\n")
    assert proc.returncode == 1
    assert "81 characters" in proc.stderr
    assert "full stop" in proc.stderr
    assert "line 2 blank" in proc.stderr


def test_a_missing_message_file_is_one_clear_line(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(HOOK), str(tmp_path / "nope")], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 2
    assert "cannot read the message file" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_git_runs_the_installed_hook(tmp_path):
    repo = tmp_path / "repo"
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.invalid",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CONFIG_NOSYSTEM": "1",
    }

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, env=env, timeout=60)

    subprocess.run(["git", "init", "-q", str(repo)], check=True, env=env, timeout=60)
    hook = repo / ".git" / "hooks" / "commit-msg"
    hook.write_text(f'#!/bin/sh\nexec {sys.executable} {HOOK} "$1"\n', encoding="utf-8")
    hook.chmod(0o755)
    refused = git("commit", "-q", "--allow-empty", "-m", "Subject." + " word" * 20)
    assert refused.returncode != 0
    assert "commit refused" in refused.stderr
    accepted = git("commit", "-q", "--allow-empty", "-m", "Add a readable subject", "-m", "Why it was needed.")
    assert accepted.returncode == 0, accepted.stderr
    assert git("log", "--format=%s").stdout.strip() == "Add a readable subject"
