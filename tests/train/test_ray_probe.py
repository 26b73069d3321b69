"""``probe_ray_address``: a quick TCP check of ``--ray-address`` before Ray is asked to join."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from ftkit.errors import ConfigError
from ftkit.train.control.ray_probe import probe_ray_address, split_address


@pytest.fixture()
def listener() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield s.getsockname()[1]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again on exit: nothing listens there


def test_a_listening_address_passes(listener: int) -> None:
    probe_ray_address(f"127.0.0.1:{listener}", timeout_s=10)
    probe_ray_address(f"ray://127.0.0.1:{listener}", timeout_s=10)
    probe_ray_address(f"localhost:{listener}", timeout_s=10)


def test_nothing_listening_is_a_config_error() -> None:
    port = _closed_port()
    with pytest.raises(ConfigError, match="nothing listens at 127.0.0.1") as err:
        probe_ray_address(f"127.0.0.1:{port}", timeout_s=10)
    assert err.value.exit_code == 2 and err.value.hint


@pytest.mark.parametrize(
    "address, message",
    [
        ("127.0.0.1", "expected HOST:PORT"),
        ("127.0.0.1:notaport", "expected HOST:PORT"),
        ("127.0.0.1:70000", "expected HOST:PORT"),
        (":6379", "expected HOST:PORT"),
        ("http://127.0.0.1:8265", "unsupported scheme 'http'"),
        ("host.invalid:6379", "cannot resolve host 'host.invalid'"),
    ],
)
def test_malformed_or_unresolvable_addresses(address: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        probe_ray_address(address, timeout_s=10)


def test_local_starts_a_new_instance_and_is_not_probed() -> None:
    probe_ray_address("local", timeout_s=1)


def test_split_address_forms() -> None:
    assert split_address("10.0.0.5:6379") == ("10.0.0.5", 6379)
    assert split_address("[::1]:6379") == ("::1", 6379)
    assert split_address("ray://head:10001/") == ("head", 10001)


def test_auto_without_a_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    with pytest.raises(ConfigError, match="no running Ray cluster found"):
        probe_ray_address("auto", timeout_s=10)
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{_closed_port()}\n")
    with pytest.raises(ConfigError, match="nothing listens"):
        probe_ray_address("auto", timeout_s=10)


def test_auto_follows_ray_address(listener: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{listener}")
    probe_ray_address("auto", timeout_s=10)


def test_an_address_that_never_answers_ends_at_the_timeout() -> None:
    # TEST-NET-1 (RFC 5737) is never routed: dropped (the timeout), unreachable or refused
    # by a sandbox; whichever, the probe ends and says so.
    with pytest.raises(ConfigError, match=r"--ray-address 192.0.2.1:6379: .*192.0.2.1"):
        probe_ray_address("192.0.2.1:6379", timeout_s=1)


def test_train_with_a_dead_address_is_exit_2_before_anything_starts(tmp_path: Path) -> None:
    """The driver probes --ray-address first (as a user runs it, in its own process): nothing
    listens -> exit 2 within seconds, one Error line, no run directory."""
    import socket
    import subprocess
    import sys

    with socket.socket() as s:  # a port nobody listens on once this socket is closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "ftkit", "train", "--out", str(out), "--ray-address", f"127.0.0.1:{port}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stdout == "" and proc.stderr.count("Error:") == 1, proc.stderr
    assert "nothing listens" in proc.stderr and "Traceback" not in proc.stderr
    assert not out.exists()


def test_reasons_are_plain_text() -> None:
    from ftkit.train.control.ray_session import plain_line

    assert plain_line("\x1b[36mray::Worker\x1b[39m died\nsecond line") == "ray::Worker died"
    assert plain_line("") == ""
