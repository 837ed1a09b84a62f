"""The run talks only to its own server (issue 18, seen case 9): the port its server listens on is never free
between being chosen and being served, and the health check asks for an identity only that server was given."""
from __future__ import annotations

import subprocess
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from flows import server


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
