"""Starting Baton services as child processes and waiting for their ready line (used by `baton
serve`, the benchmarks and the tests, which all run real processes on loopback)."""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field

READY = re.compile(r"baton \w+ ready: .*address=(\S+)")


@dataclass
class ServiceProcess:
    name: str
    process: subprocess.Popen
    address: str = ""
    output: deque[str] = field(default_factory=lambda: deque(maxlen=200))
    ready: threading.Event = field(default_factory=threading.Event)
    # how it was started (the whole command line): a relaunch repeats it, ports included
    command: list[str] = field(default_factory=list)
    env: dict[str, str] | None = None

    def relaunch(self) -> None:
        """Starts the service again as it was started (on the same ports), once it has exited;
        wait_ready waits for the new process."""
        if self.process.poll() is None:
            raise RuntimeError(f"{self.name} is still running")
        self.ready.clear()
        self.output.append(f"[{self.name} restarted]")
        self.process = _spawn(self.command, self.env)
        _follow_output(self)

    def wait_ready(self, timeout: float = 120.0) -> "ServiceProcess":
        """Returns once the ready line was printed; raises RuntimeError with the output if the
        process exits or stays silent first."""
        deadline = time.monotonic() + timeout
        while not self.ready.wait(0.1):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.process.kill()
                raise RuntimeError(f"{self.name} did not become ready:\n{self.log()}")
        return self

    def terminate(self, timeout: float = 30.0) -> int:
        """SIGTERM (the service drains), then SIGKILL if it has not exited within timeout."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
        return self.process.wait()

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()

    def log(self) -> str:
        return "\n".join(self.output)


def launch_service(name: str, args: list[str], env: dict[str, str] | None = None) -> ServiceProcess:
    """Starts `baton ARGS...` without waiting, so several services can start side by side; see
    wait_ready."""
    return launch_command(name, [sys.executable, "-m", "baton.services.cli.main", *args], env)


def launch_command(name: str, command: list[str],
                   env: dict[str, str] | None = None) -> ServiceProcess:
    """Starts any command as a service (its output kept, its ready line watched for)."""
    service = ServiceProcess(name, _spawn(command, env), command=list(command), env=env)
    _follow_output(service)
    return service


def _spawn(command: list[str], env: dict[str, str] | None) -> subprocess.Popen:
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **(env or {})})


def _follow_output(service: ServiceProcess) -> None:
    """Keeps the process's last lines and sets `ready` (and the address) at its ready line."""
    process = service.process

    def pump() -> None:
        for line in process.stdout:
            service.output.append(line.rstrip())
            match = READY.search(line)
            if match and not service.ready.is_set():
                service.address = match.group(1)
                service.ready.set()

    threading.Thread(target=pump, name=f"{service.name}-output", daemon=True).start()


def start_service(name: str, args: list[str], env: dict[str, str] | None = None,
                  timeout: float = 120.0) -> ServiceProcess:
    return launch_service(name, args, env).wait_ready(timeout)


def free_port() -> int:
    """A port free on loopback right now (for tests and single-machine stacks)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
