#!/usr/bin/env python3
"""The login-node relay's start over the dev cluster's sshd, the quick way (an absolute
python3, ``-I -S``) against the plain way (the python3 the login shell's PATH names, what
``main`` did), interleaved in the same run, with one bare SSH command (``true``: an sshd
session and the user's shell, the part no start can avoid) as the floor, and a new
connection with one command (what the run's early connection costs first).

    python3 benchmarks/bench_relay_start.py [--reps R]

Each figure is the median (min-max) of R starts on one SSH connection; a start ends when
the relay said it is ready and answered one command.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import paramiko  # noqa: E402
from bench_common import cluster  # noqa: E402

from pytest_trtllm_slurm.transport.ssh.relay_client import RelayChannel  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=9)
    args = parser.parse_args()
    ssh = cluster()["ssh"]
    client = paramiko.SSHClient()
    client.load_host_keys(ssh["known_hosts"])
    client.connect(ssh["host"], ssh["port_key"], ssh["user"], key_filename=ssh["identity_file"],
                   allow_agent=False, look_for_keys=False)
    transport = client.get_transport()
    assert transport is not None

    def bare() -> float:
        start = time.perf_counter()
        chan = transport.open_session()
        chan.exec_command("true")
        chan.recv_exit_status()
        return time.perf_counter() - start

    def connected() -> float:
        """What an early connection costs before any relay: a new connection (key exchange,
        host key check, key authentication) and one command on it."""
        start = time.perf_counter()
        fresh = paramiko.SSHClient()
        fresh.load_host_keys(ssh["known_hosts"])
        fresh.connect(ssh["host"], ssh["port_key"], ssh["user"],
                      key_filename=ssh["identity_file"], allow_agent=False, look_for_keys=False)
        fresh_transport = fresh.get_transport()
        assert fresh_transport is not None
        chan = fresh_transport.open_session()
        chan.exec_command("true")
        chan.recv_exit_status()
        took = time.perf_counter() - start
        fresh.close()
        return took

    def relay(quick: bool) -> float:
        start = time.perf_counter()
        channel = RelayChannel.start(transport, quick=quick)
        assert channel is not None, "the relay did not come up"
        assert channel.run(["true"], timeout=30, input=None, env=None, cwd=None).returncode == 0
        took = time.perf_counter() - start
        channel.close()
        return took

    ways: dict[str, Callable[[], float]] = {
        "one bare SSH command": bare,
        "a new connection + one command": connected,
        "relay, plain start (PATH)": lambda: relay(False),
        "relay, quick start": lambda: relay(True),
    }
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.reps):
        for name, way in ways.items():
            times[name].append(way())
    client.close()
    med = {name: statistics.median(v) for name, v in times.items()}
    for name, values in times.items():
        print(f"{name:28s} {med[name] * 1000:7.0f} ms ({min(values) * 1000:.0f}-"
              f"{max(values) * 1000:.0f})")
    plain, quick = med["relay, plain start (PATH)"], med["relay, quick start"]
    print(f"quick / plain: {quick / plain:.2f}x, saving {(plain - quick) * 1000:.0f} ms")


if __name__ == "__main__":
    main()
