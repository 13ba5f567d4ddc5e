"""How `shoal up` chooses its GPUs' sharing (`--mps auto|on|off`, deploy.local.mps), and how it
drives an MPS control daemon: here a stand-in `nvidia-cuda-mps-control` (a shell script that
records what it was asked and keeps the daemon's control pipe as a file), since this machine has
no NVIDIA driver. The real daemon, its limits inside shoal up's replicas and what it does to their
throughput are tests/gpu/test_gpu.py's."""

from __future__ import annotations

import stat
from fractions import Fraction
from pathlib import Path

import pytest

from autoscaler.placement import Device, Placement
from deploy.local.backend import replica_env
from deploy.cli.commands import render_top
from deploy.local.mps import CONTROL, DEFAULT_PIPE, LOG_ENV, PIPE_ENV, answers, choose, gpu_sharing
from deploy.local.server import main as shoal_up

FAKE_CONTROL = """#!/bin/bash
# stands in for nvidia-cuda-mps-control: -d starts "the daemon" (its control pipe, a file);
# a command on stdin is sent to it, and fails where no daemon runs
record="$(dirname "$0")/asked"
if [ "$1" = "-d" ]; then
    echo "-d pipe=$CUDA_MPS_PIPE_DIRECTORY log=$CUDA_MPS_LOG_DIRECTORY" >> "$record"
    [ -n "$FAIL" ] && { echo "$FAIL" >&2; exit 1; }
    [ -e "$CUDA_MPS_PIPE_DIRECTORY/control" ] && { echo "An instance of this daemon is already running" >&2; exit 1; }
    touch "$CUDA_MPS_PIPE_DIRECTORY/control"
    exit 0
fi
read -r command
echo "$command pipe=$CUDA_MPS_PIPE_DIRECTORY" >> "$record"
[ -e "$CUDA_MPS_PIPE_DIRECTORY/control" ] || { echo "Cannot find MPS control daemon process" >&2; exit 1; }
[ "$command" = "quit" ] && rm -f "$CUDA_MPS_PIPE_DIRECTORY/control"
exit 0
"""


@pytest.fixture
def control(tmp_path) -> Path:
    path = tmp_path / "bin" / CONTROL
    path.parent.mkdir()
    path.write_text(FAKE_CONTROL)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _asked(control: Path) -> list[str]:
    record = control.parent / "asked"
    return record.read_text().splitlines() if record.exists() else []


def _running(*dirs: str):
    return lambda pipe: pipe in dirs


@pytest.mark.parametrize("mode, gpus, environ, found, running, want", [
    ("auto", False, {}, "/x", (), ("none", "no GPU")),
    ("off", False, {}, "/x", (), ("none", "no GPU")),
    ("off", True, {PIPE_ENV: "/p"}, "/x", ("/p", DEFAULT_PIPE), ("time-sliced", "--mps off")),  # not even an operator's
    ("auto", True, {PIPE_ENV: "/p"}, None, ("/p",), ("inherit", "/p")),
    ("on", True, {PIPE_ENV: "/p"}, None, ("/p",), ("inherit", "/p")),
    ("auto", True, {PIPE_ENV: "/p"}, "/x", (), ("time-sliced", f"no MPS daemon answers at {PIPE_ENV}=/p")),
    ("auto", True, {}, None, (DEFAULT_PIPE,), ("inherit", DEFAULT_PIPE)),  # CUDA's default, no env
    ("auto", True, {}, None, (), ("time-sliced", f"no {CONTROL} on PATH")),
    ("auto", True, {}, "/x", (), ("start", "an MPS daemon of shoal up's own")),
    ("on", True, {}, "/x", (), ("start", "an MPS daemon of shoal up's own")),
], ids=["no-gpu", "off-no-gpu", "off", "named", "on-named", "named-dead", "default-pipe", "no-binary", "start",
        "on-start"])
def test_the_sharing_chosen_for_each_mode(mode, gpus, environ, found, running, want):
    assert choose(mode, gpus, environ, found, _running(*running)) == want


@pytest.mark.parametrize("mode, gpus, environ, found, words", [
    ("on", False, {}, "/x", "--mps on needs an NVIDIA GPU"),
    ("on", True, {}, None, f"--mps on: no {CONTROL} on PATH"),
    ("on", True, {PIPE_ENV: "/p"}, "/x", f"--mps on: no MPS daemon answers at {PIPE_ENV}=/p"),
    ("always", True, {}, "/x", "--mps 'always' is invalid"),
], ids=["no-gpu", "no-binary", "named-dead", "bad-mode"])
def test_mps_that_cannot_be_had_is_refused(mode, gpus, environ, found, words):
    with pytest.raises(ValueError, match=words):
        choose(mode, gpus, environ, found, _running())


def _alive(pipe: str) -> bool:
    """The stand-in daemon answers where its control file is."""
    return (Path(pipe) / "control").exists()


def _sharing(control: Path, directory: Path, mode: str = "auto", environ: dict | None = None):
    return gpu_sharing(mode, True, directory, environ={} if environ is None else environ,
                       which=lambda _: str(control), running=_alive)


def test_shoal_up_starts_a_daemon_of_its_own_and_quits_it(control, tmp_path):
    sharing, daemon = _sharing(control, tmp_path / "mps")
    pipe, logs = tmp_path / "mps" / "pipe", tmp_path / "mps" / "log"
    assert sharing.mode == "mps" and dict(sharing.env) == {PIPE_ENV: str(pipe), LOG_ENV: str(logs)}
    assert str(pipe) in sharing.why
    assert (pipe / "control").exists() and logs.is_dir()
    assert _asked(control) == [f"-d pipe={pipe} log={logs}"]
    daemon.quit()
    assert not (pipe / "control").exists()
    assert _asked(control)[-1] == f"quit pipe={pipe}"


def test_each_start_keeps_the_last_runs_daemon_logs_and_no_older(control, tmp_path):
    logs = tmp_path / "mps" / "log"
    for run in ("first", "second", "third"):
        sharing, daemon = _sharing(control, tmp_path / "mps")
        (logs / "control.log").write_text(f"{run}\n")  # as the daemon appends to it
        daemon.quit()
    assert (logs / "control.log").read_text() == "third\n"
    assert (logs / "control.log.1").read_text() == "second\n"
    assert sorted(p.name for p in logs.iterdir()) == ["control.log", "control.log.1"]


@pytest.mark.parametrize("mode", ["auto", "off"])
def test_a_daemon_a_killed_shoal_up_left_is_quit_at_the_next_start(control, tmp_path, mode):
    _sharing(control, tmp_path / "mps")  # never quit: shoal up was killed
    sharing, daemon = _sharing(control, tmp_path / "mps", mode)
    asked = [line.split()[0] for line in _asked(control)]
    assert asked == (["-d", "quit", "-d"] if mode == "auto" else ["-d", "quit"]), asked
    assert sharing.mode == ("mps" if mode == "auto" else "time-sliced")
    if daemon is not None:
        daemon.quit()


def test_time_sliced_replicas_are_pointed_where_no_daemon_answers(control, tmp_path):
    """`--mps off` while an operator's daemon runs: its replicas get an empty pipe directory, so
    that CUDA's own lookup (the env, else /tmp/nvidia-mps) finds no daemon."""
    sharing, daemon = _sharing(control, tmp_path / "mps", "off", {PIPE_ENV: "/run/mps"})
    assert daemon is None and sharing.mode == "time-sliced"
    empty = Path(sharing.env[PIPE_ENV])
    assert empty.is_dir() and not any(empty.iterdir()) and str(empty) != "/run/mps"


def test_a_daemon_that_does_not_start_leaves_the_gpus_time_sliced_or_fails_on(control, tmp_path, monkeypatch):
    monkeypatch.setenv("FAIL", "MPS is not supported on this GPU")
    sharing, daemon = _sharing(control, tmp_path / "mps")
    assert daemon is None and sharing.mode == "time-sliced" and PIPE_ENV in sharing.env
    assert "MPS is not supported on this GPU" in sharing.why
    with pytest.raises(ValueError, match="--mps on: .*MPS is not supported on this GPU"):
        _sharing(control, tmp_path / "mps", "on")


def test_a_directory_that_cannot_be_made_is_a_daemon_that_does_not_start(control, tmp_path):
    (tmp_path / "mps").write_text("a file where the directory would go")
    sharing, daemon = _sharing(control, tmp_path / "mps")
    assert daemon is None and sharing.mode == "time-sliced" and "cannot prepare" in sharing.why, sharing


def test_an_operators_daemon_is_used_and_nothing_is_started(control, tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "control").touch()
    environ = {PIPE_ENV: str(tmp_path / "run"), LOG_ENV: "/var/log/mps"}
    sharing, daemon = _sharing(control, tmp_path / "mps", environ=environ)
    assert daemon is None and sharing.mode == "mps" and dict(sharing.env) == environ
    assert _asked(control) == []


def test_the_daemon_answers_where_its_control_socket_listens(tmp_path):
    import socket

    assert not answers(tmp_path)
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as listening:
        listening.bind(str(tmp_path / "control"))
        listening.listen()
        assert answers(tmp_path)
    assert not answers(tmp_path)  # the socket file is left, nobody listens: a killed daemon's


def test_only_gpu_replicas_get_the_daemon():
    env = {PIPE_ENV: "/p", LOG_ENV: "/l"}
    gpu = replica_env(Placement("f-1", Device("gpu:1", "gpu", 81920), Fraction(1, 4), 1024, ()), None, env)
    assert gpu[PIPE_ENV] == "/p" and gpu[LOG_ENV] == "/l" and gpu["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    cpu = replica_env(Placement("f-1", Device("cpu:0", "cpu", 16384, cpus=(0, 1)), Fraction(1, 2), 0, (1,)), None, env)
    assert PIPE_ENV not in cpu and LOG_ENV not in cpu


def test_shoal_top_says_how_the_gpus_are_shared():
    status = {"functions": {}, "devices": [{"id": "gpu:0", "emulated": False, "allocated": 0.5, "sharing": "mps"}],
              "gpu_sharing": {"mode": "mps", "why": "an MPS daemon of shoal up's own, pipe /s/mps/pipe"}}
    text = render_top(status)
    assert "gpu:0 mps 50%" in text
    assert "GPU sharing: mps (an MPS daemon of shoal up's own, pipe /s/mps/pipe)" in text
    cpu = render_top({"functions": {}, "devices": [{"id": "cpu:0", "emulated": False, "allocated": 0.0}],
                      "gpu_sharing": {"mode": "none", "why": "no GPU"}})
    assert "GPU sharing" not in cpu and "cpu:0 0%" in cpu


def test_shoal_up_mps_on_without_a_gpu_exits_2(tmp_path, capsys):
    assert shoal_up(["--state-dir", str(tmp_path / "state"), "--devices", "cpu", "--mps", "on", "--port", "0"]) == 2
    assert "--mps on needs an NVIDIA GPU" in capsys.readouterr().err
