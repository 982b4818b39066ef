"""What listens where once the tool starts its private Ray instance (issue 23, item 7), measured with psutil
on a real local Ray 2.60 in a child process whose HOME is a temporary folder (so Ray writes its token there).

Ray 2.60 offers no setting that binds the gRPC servers of its GCS, raylet and workers to one address (its
GrpcServer listens on 0.0.0.0 unless the server is built for localhost only: src/ray/rpc/grpc_server.cc,
GrpcServer::Run), so this pins what docs/reliability.md says: those listen on every interface, everything
else on 127.0.0.2, and the token that guards them is readable by its owner only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

_MEASURE = """
import json, os, time, psutil, ray
from orchestrator.execute.ray_actor import init_local, token_file
init_local(num_gpus=1, num_cpus=2)
time.sleep(2)
me = psutil.Process()
procs = {p.pid: p for p in [me, *me.children(recursive=True)]}
rows = []
for c in psutil.net_connections(kind="inet"):
    if c.status == psutil.CONN_LISTEN and c.pid in procs:
        try:
            name = procs[c.pid].name()
            cmd = " ".join(procs[c.pid].cmdline())
        except psutil.Error:
            name = cmd = "?"
        rows.append({"ip": c.laddr.ip, "port": c.laddr.port, "name": name, "cmd": cmd, "driver": c.pid == me.pid})
path = token_file()
print(json.dumps({"listeners": rows, "token_mode": stat.S_IMODE(os.stat(path).st_mode) if path.exists() else None,
                  "token_path": str(path)}))
ray.shutdown()
""".replace("import json, os", "import json, os, stat")

WILDCARD = {"0.0.0.0", "::"}  # noqa: S104 - what is measured, nothing binds here
WILDCARD_OWNERS = ("gcs_server", "raylet", "ray::", "monitor.py")
"""Ray's gRPC servers (GCS, raylet, each core worker; the autoscaler monitor's), plus the driver's own core worker."""


@pytest.mark.slow
def test_the_private_ray_listens_where_the_docs_say_and_its_token_is_private(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    proc = subprocess.run(
        [sys.executable, "-c", _MEASURE], capture_output=True, text=True, timeout=180, env={**env, "HOME": str(home)}
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    measured = json.loads(proc.stdout.strip().splitlines()[-1])
    assert measured["token_path"] == str(home / ".ray" / "auth_token")
    assert measured["token_mode"] == 0o600, oct(measured["token_mode"] or 0)  # Ray wrote it 0644 (the umask's)
    listeners = measured["listeners"]
    assert listeners, "no listening socket found"
    for row in listeners:
        if row["ip"] in WILDCARD:
            assert row["driver"] or any(owner in row["cmd"] or owner in row["name"] for owner in WILDCARD_OWNERS), row
        else:
            assert row["ip"] == "127.0.0.2", row  # the runtime-env agent, and nothing on an external address
