"""The run talks only to its own server (issue 18, seen case 9): the port its server listens on is never free
between being chosen and being served, and the health check asks for an identity only that server was given."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from core_fixtures import build, objects

from flows import server
from flows.rundb import FOLDER


class Impostor:
    """Any other HTTP server: 200 and `{}` to every GET and POST, each request recorded."""

    def __init__(self):
        self.requests: list[str] = []
        self.httpd: ThreadingHTTPServer | None = None

    def take(self, port: int) -> bool:
        """Listen on `port` if it can be bound now."""
        impostor = self

        class Handler(BaseHTTPRequestHandler):
            def answer(self):
                impostor.requests.append(f"{self.command} {self.path}")
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            do_GET = do_POST = do_PATCH = answer

            def log_message(self, *args):
                pass

        try:
            self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        except OSError:
            return False
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/api"

    def close(self) -> None:
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()


@pytest.fixture
def impostor():
    it = Impostor()
    yield it
    it.close()


@pytest.fixture
def home(tmp_path, monkeypatch):
    """No server named anywhere (not even by a session's test harness): a run starts its own."""
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setattr(server, "configured_api", lambda: None)
    return tmp_path / "home"


@pytest.mark.slow
def test_a_server_that_grabs_the_runs_port_first_is_never_talked_to(home, impostor, monkeypatch):
    """Deterministic form of two runs handed the same port: right before the run's server process starts,
    another server takes the port the run chose, if the port can be taken then."""
    real_popen = subprocess.Popen

    def popen(argv, *args, **kwargs):
        if "flows.apiserver" in argv:
            impostor.take(int(argv[argv.index("--port") + 1]))
        return real_popen(argv, *args, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", popen)
    with server.prefect_api() as url:
        with urllib.request.urlopen(f"{url}/health", timeout=10) as resp:
            assert resp.status == 200
    assert impostor.requests == []
    assert impostor.httpd is None, "the port was free to take between its choice and the server's start"


@pytest.mark.slow
def test_the_health_check_refuses_a_server_it_did_not_start(home, impostor):
    """Whatever answers /api/health at the run's URL is not taken for the run's own server."""
    assert impostor.take(0)
    run_server = server.RunServer("127.0.0.1", ui=False, keep_history=False)
    try:
        run_server.url = impostor.url  # another server at the address the run polls
        with pytest.raises(RuntimeError, match="did not start"):
            run_server.wait_healthy()
    finally:
        run_server.stop()


@pytest.mark.slow
def test_the_runs_own_server_proves_its_identity(home):
    run_server = server.RunServer("127.0.0.1", ui=False, keep_history=False)
    try:
        run_server.wait_healthy()
        assert server.identity_at(run_server.url) == run_server.identity != ""
    finally:
        run_server.stop()


REPO = Path(__file__).resolve().parents[1]
# A `sidecar-ops` process that records, when it spawns its server, which heavy modules it has imported, and at
# its first shard read whether pyarrow's pandas is imported; prints its exit code and those as JSON.
RECORDING_CLI = """
import json, subprocess, sys
from flows.cli import main
seen = {"at_spawn": None, "pandas_at_first_read": None, "server_exited": None}
procs = []
real_popen = subprocess.Popen
def popen(argv, *args, **kwargs):
    if "flows.apiserver" not in argv:
        return real_popen(argv, *args, **kwargs)
    seen["at_spawn"] = sorted(m for m in ("tasks.config", "pyarrow", "prefect") if m in sys.modules)
    procs.append(real_popen(argv, *args, **kwargs))
    from tasks import kernel
    real_open_shard = kernel.open_shard
    def open_shard(*args, **kwargs):
        if seen["pandas_at_first_read"] is None:
            seen["pandas_at_first_read"] = "pandas" in sys.modules
        return real_open_shard(*args, **kwargs)
    kernel.open_shard = open_shard
    return procs[-1]
subprocess.Popen = popen
seen["code"] = main(sys.argv[1:])
seen["server_exited"] = [p.poll() is not None for p in procs]
print(json.dumps(seen))
"""


def recorded_run(tmp_path, *argv) -> tuple[dict, str]:
    proc = subprocess.run([sys.executable, "-c", RECORDING_CLI, "run", *map(str, argv)], cwd=REPO,
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


@pytest.mark.slow
def test_the_server_starts_before_the_yamls_are_read_while_the_flow_gets_ready(tmp_path, home):
    """The server (most of a one-shard run's time) boots while this process reads the YAMLs, imports the flow
    and pyarrow's pandas (else imported by the first shard task): nothing heavy is imported when it starts."""
    setup = build(tmp_path, str(tmp_path / "data"), shards=1, watermark_gap=False)
    seen, err = recorded_run(tmp_path, setup.pipeline, "--output-prefix", setup.output)
    assert seen["code"] == 0, err
    assert seen["at_spawn"] == [], "the server starts before the config models, pyarrow and Prefect are imported"
    assert seen["pandas_at_first_read"] is True
    assert seen["server_exited"] == [True]


@pytest.mark.slow
def test_bad_input_stops_the_server_started_for_it_leaving_nothing(tmp_path, home):
    """A YAML error is still one line and exit 2; the server started meanwhile is gone with its database."""
    setup = build(tmp_path, str(tmp_path / "data"), shards=1, watermark_gap=False)
    bad = Path(setup.pipeline).with_name("bad.yaml")
    bad.write_text(Path(setup.pipeline).read_text().replace("operations:", "operations: [", 1))
    seen, err = recorded_run(tmp_path, bad, "--output-prefix", setup.output)
    assert seen["code"] == 2, err
    assert err.strip().startswith(f"error: {bad}:") and len(err.strip().splitlines()) == 1, err
    assert seen["at_spawn"] == [] and seen["server_exited"] == [True]
    assert list((home / FOLDER).glob("run-*")) == [], "the run's database is removed"
    assert objects(setup.output) == []
