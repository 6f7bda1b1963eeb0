"""olah, a self-hosted Hugging Face mirror (PyPI), serving local git repos on 127.0.0.1 as
the Hub for the download-fault tests: real Hub routes (model info, file tree, resolve) that
the real huggingface_hub client talks to through HF_ENDPOINT.

olah runs offline (it never calls huggingface.co) and serves each git repo under
`mirrors/models/ORG/NAME`. A repo matched by a `deny` rule is answered as the Hub answers a
repo a caller may not see: HTTP 401 with X-Error-Code RepoNotFound. Its access log (uvicorn's
lines on olah's stdout) tells which files were fetched and how often.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

GIT = ["git", "-c", "user.name=sparkserve-tests", "-c", "user.email=tests@localhost"]
ACCESS = re.compile(r'"(GET|HEAD) /(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[0-9a-f]+)/(?P<file>\S+) ')


def make_repo(mirrors: Path, repo_id: str, files: Path) -> str:
    """A git repo of `files`' contents at mirrors/models/REPO_ID; its commit."""
    repo = mirrors / "models" / repo_id
    shutil.copytree(files, repo, ignore=shutil.ignore_patterns(".*"))
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    subprocess.run([*GIT, "-C", str(repo), "add", "."], check=True)
    subprocess.run([*GIT, "-C", str(repo), "commit", "-qm", "tiny model"], check=True)
    done = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    )
    return done.stdout.strip()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class HubMirror:
    process: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def fetched(self, method: str = "GET") -> list[str]:
        """Every file requested with `method` so far, one entry a request, as REPO/FILE."""
        found = []
        for line in self.log.read_text(errors="replace").splitlines():
            match = ACCESS.search(line)
            if match and match.group(1) == method:
                found.append(f"{match.group('repo')}/{match.group('file')}")
        return found

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start_mirror(olah_cli: str, work: Path, deny: list[str], ready_repo: str) -> HubMirror:
    """olah on a free port serving work/mirrors, offline; waits until `ready_repo` answers."""
    port = free_port()
    rules = "".join(f'\n[[accessibility.proxy]]\nrepo = "{repo}"\nallow = false\n' for repo in deny)
    config = work / "olah.toml"
    config.write_text(
        f'[basic]\nhost = "127.0.0.1"\nport = {port}\nrepos-path = "{work / "repos"}"\n'
        f'mirror-scheme = "http"\nmirror-netloc = "127.0.0.1:{port}"\n'
        f'mirror-lfs-netloc = "127.0.0.1:{port}"\nmirrors-path = ["{work / "mirrors"}"]\n'
        f"\n[accessibility]\noffline = true\n"
        '\n[[accessibility.proxy]]\nrepo = "*"\nallow = true\n'
        '\n[[accessibility.proxy]]\nrepo = "*/*"\nallow = true\n' + rules
    )
    log = work / "olah.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [olah_cli, "-c", str(config), "--log-path", str(work / "logs")],
            cwd=work, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    mirror = HubMirror(process, port, log)
    deadline = time.monotonic() + 60
    probe = f"{mirror.url}/api/models/{ready_repo}/revision/main"
    while True:
        try:
            with urllib.request.urlopen(probe, timeout=2) as answer:
                if answer.status == 200:
                    return mirror
        except OSError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            mirror.stop()
            raise RuntimeError(f"olah did not start: {log.read_text()[-2000:]}")
        time.sleep(0.2)
