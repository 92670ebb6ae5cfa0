"""The documentation runs as written: every fenced `python`, `sh` and `console` block of README.md and docs/ is
executed, in order, page by page, or skipped with the reason its page gives; the site builds with --strict.

A page is read as a reader follows it, in one shell session: a `cd` or an `export` in one block holds for the
next. Pages start in the clone; README.md's commands name `.venv/bin/...` themselves, the pages of docs/ run with
the venv of `make build` active, as docs/index.md says. `~` is a fresh home folder per page (pip keeps its own
configuration and cache). Python blocks run with the `.venv/bin/python` of the folder the session is in, else the
active venv's `python`, fed on standard input as if pasted; nothing puts the generated package on PYTHONPATH: the
venv must import it. `console` blocks are `$ command` lines, each followed by its expected output (`...` stands
for any text, a line of just `...` for any lines).

A directive, an HTML comment on the line before a block, says how a block runs when it is not a plain command:
- `<!-- docs-test: skip REASON -->`: not run here; a skip that gives REASON.
- `<!-- docs-test: serve -->`: one command that serves until stopped. It is started in the background with
  `--http-port 0 --grpc-port 0 --ports-file F` added (for `make serve`, in SERVE_ARGS), on free ports; the page's
  later blocks have the documented ports (8000 REST, 8001 gRPC) replaced by those, and it is stopped (SIGTERM)
  at the end. The same command in another page reuses the running server.
- `<!-- docs-test: file PATH -->`: the block's text is the file PATH (relative to the session's folder), as the
  reader is told to write it.
A page that calls a server it does not start says which, once: `<!-- docs-test: serving COMMAND -->`.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
RUN = {"python", "sh", "console"}
DIRECTIVE = re.compile(r"^<!-- docs-test: (skip|serve|file|serving)(?: (.+?))? -->$")
FENCE = re.compile(r"^( *)```(\S*)\s*$")
PORTS = {"8000": "http", "8001": "grpc"}  # the documented ports, as the docs write them
SERVE_TIMEOUT = 180.0  # `make serve` builds first
BLOCK_TIMEOUT = 900.0  # a block that creates a venv and installs into it
NESTED = "OIPGEN_DOCS_TEST"  # set for the blocks: a suite started by a block (`make test`) does not run them again

pytestmark = pytest.mark.skipif(bool(os.environ.get(NESTED)), reason="started by a block of the docs themselves")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    directive: str = ""
    argument: str = ""

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def parse(page: Path) -> tuple[list[Block], str]:
    """The page's fenced blocks (with the directive before each), and the server it says it calls, if any."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    serving = ""
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            found = DIRECTIVE.match(lines[i].strip())
            if found and found.group(1) == "serving":
                serving = found.group(2) or ""
            i += 1
            continue
        indent, lang = opening.groups()
        end = i + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        body = "\n".join(line[len(indent):] for line in lines[i + 1:end]) + "\n"
        before = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        found = DIRECTIVE.match(before)
        kind, argument = (found.group(1), found.group(2) or "") if found and found.group(1) != "serving" else ("", "")
        blocks.append(Block(page, i + 1, lang, body, kind, argument))
        i = end + 1
    return blocks, serving


def runnable(block: Block) -> bool:
    return block.lang in RUN or block.directive == "file"


ALL = [block for page in PAGES for block in parse(page)[0] if runnable(block)]


# --- servers -------------------------------------------------------------------------------------------------


@dataclass
class Server:
    command: str
    process: subprocess.Popen[bytes]
    log: Path
    ports: dict[str, int]

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)  # its own group: make and the server it started
            try:
                self.process.wait(timeout=40)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)


def _command_line(text: str) -> str:
    """A serve block's one command, without its comment."""
    lines = [re.sub(r"\s+#.*$", "", line).strip() for line in text.splitlines()]
    lines = [line for line in lines if line]
    assert len(lines) == 1, f"a serve block holds one command: {text!r}"
    return lines[0]


def start_server(command: str, cwd: Path, env: dict[str, str], scratch: Path) -> Server:
    ports_file = scratch / f"ports-{time.monotonic_ns()}.json"
    extra = f"--http-port 0 --grpc-port 0 --ports-file {shlex.quote(str(ports_file))}"
    line = f"{command} SERVE_ARGS={shlex.quote(extra)}" if command.startswith("make ") else f"{command} {extra}"
    log = ports_file.with_suffix(".log")
    with log.open("wb") as out:
        process = subprocess.Popen(["bash", "-c", line], cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    server = Server(command, process, log, {})
    deadline = time.monotonic() + SERVE_TIMEOUT
    try:
        while not ports_file.is_file() or not ports_file.read_text().strip():
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"`{line}` did not serve (exit {process.poll()}):\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        server.ports = json.loads(ports_file.read_text())
        while True:  # listening; ready once its models are
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{server.ports['http']}/v2/health/ready", timeout=5):
                    break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"`{line}` never got ready:\n{log.read_text()[-3000:]}") from None
                time.sleep(0.2)
    except BaseException:
        server.stop()
        raise
    return server


# --- a page's session ----------------------------------------------------------------------------------------


def base_env(home: Path) -> dict[str, str]:
    """A login-like environment: the user's PATH without any venv, a fresh home, pip's configuration and cache."""
    keep = ("LANG", "LC_ALL", "TERM", "TMPDIR", "PYENV_ROOT", "SSL_CERT_FILE")
    env = {k: v for k, v in os.environ.items() if k in keep or k.startswith("PIP_")}
    venv_bins = {str(Path(sys.prefix) / "bin"), str(ROOT / ".venv" / "bin")}
    env["PATH"] = os.pathsep.join(p for p in os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep)
                                  if p not in venv_bins)
    env["HOME"] = str(home)
    env[NESTED] = "1"
    real_home = Path(os.path.expanduser("~"))
    env.setdefault("PIP_CACHE_DIR", str(real_home / ".cache" / "pip"))
    config = real_home / ".config" / "pip" / "pip.conf"
    if config.is_file():
        env.setdefault("PIP_CONFIG_FILE", str(config))
    return env


@dataclass
class Session:
    page: Path
    home: Path
    cwd: Path
    env: dict[str, str]
    servers: dict[str, Server] = field(default_factory=dict)  # serve command -> server this page called
    failed: str = ""

    def substitute(self, text: str) -> str:
        """The documented ports replaced by those of the server the page started or calls."""
        if not self.servers:
            return text
        server = list(self.servers.values())[-1]
        for port, kind in PORTS.items():
            text = re.sub(rf"(?<=localhost:){port}\b|(?<=127\.0\.0\.1:){port}\b", str(server.ports[kind]), text)
        return text

    def shell(self, command: str, timeout: float = BLOCK_TIMEOUT) -> subprocess.CompletedProcess[str]:
        """Run `command` in bash where the session is, and carry its folder and exported variables on."""
        state = self.home.parent / f"state-{self.home.name}"
        script = (f"set -euo pipefail\n{command}\n"
                  f"{{ pwd; env -0; }} > {shlex.quote(str(state))}\n")
        result = subprocess.run(["bash", "-c", script], cwd=self.cwd, env=self.env, capture_output=True, text=True,
                                timeout=timeout)
        if result.returncode == 0:
            folder, _, environ = state.read_text().partition("\n")
            self.cwd = Path(folder)
            self.env = dict(item.split("=", 1) for item in environ.split("\0") if "=" in item)
            for transient in ("PWD", "OLDPWD", "SHLVL", "_"):
                self.env.pop(transient, None)
        return result

    def python(self) -> str:
        local = self.cwd / ".venv" / "bin" / "python"
        return str(local) if local.is_file() else "python"


def console(text: str) -> list[tuple[str, str]]:
    """`$ command` lines (a command may go on over lines, until it is complete shell) and their output."""
    steps: list[tuple[str, list[str]]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        assert lines[i].startswith("$ "), f"a console block starts with a `$ ` command: {lines[i]!r}"
        command = lines[i][2:]
        i += 1
        while subprocess.run(["bash", "-n", "-c", command], capture_output=True).returncode != 0:
            assert i < len(lines), f"incomplete command: {command!r}"
            command += "\n" + lines[i]
            i += 1
        output: list[str] = []
        while i < len(lines) and not lines[i].startswith("$ "):
            output.append(lines[i])
            i += 1
        steps.append((command, output))
    return [(command, "\n".join(output)) for command, output in steps]


def matches(expected: str, actual: str) -> bool:
    """`expected` with `...` for any text (on a line of its own: any lines), whitespace at line ends ignored."""
    pattern = "\n".join(".*?" if line.strip() == "..." else re.escape(line.rstrip()).replace(r"\.\.\.", ".*?")
                        for line in expected.strip("\n").splitlines())
    pattern = pattern.replace("\n.*?\n", "(?:\n.*?)?\n")
    text = "\n".join(line.rstrip() for line in actual.strip("\n").splitlines())
    return re.fullmatch(pattern, text, re.DOTALL) is not None


@pytest.fixture(scope="module")
def shared_servers() -> Iterator[dict[str, Server]]:
    servers: dict[str, Server] = {}
    yield servers
    for server in servers.values():
        server.stop()


@pytest.fixture(scope="module")
def sessions() -> dict[Path, Session]:
    return {}


def session_for(page: Path, sessions: dict[Path, Session], servers: dict[str, Server],
                tmp_path_factory: pytest.TempPathFactory) -> Session:
    if page not in sessions:
        home = tmp_path_factory.mktemp("home")
        env = base_env(home)
        if page.parent == ROOT / "docs":  # the pages of docs/ run with the venv of `make build` active
            env["VIRTUAL_ENV"] = str(ROOT / ".venv")
            env["PATH"] = f"{ROOT / '.venv' / 'bin'}{os.pathsep}{env['PATH']}"
        session = Session(page, home, ROOT, env)
        serving = parse(page)[1]
        if serving:
            if serving not in servers:
                servers[serving] = start_server(serving, ROOT, env, tmp_path_factory.mktemp("serve"))
            session.servers[serving] = servers[serving]
        sessions[page] = session
    return sessions[page]


@pytest.mark.parametrize("block", ALL, ids=[b.id for b in ALL])
def test_block_runs_as_written(block: Block, sessions: dict[Path, Session], shared_servers: dict[str, Server],
                               tmp_path_factory: pytest.TempPathFactory) -> None:
    if block.directive == "skip":
        pytest.skip(f"{block.id}: {block.argument or 'no reason given'}")
    session = session_for(block.page, sessions, shared_servers, tmp_path_factory)
    if session.failed:
        pytest.skip(f"an earlier block of this page failed ({session.failed})")
    session.failed = block.id  # until it passes
    if block.directive == "file":
        target = Path(block.argument.replace("~", str(session.home), 1) if block.argument.startswith("~")
                      else session.cwd / block.argument)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(block.text, encoding="utf-8")
    elif block.directive == "serve":
        command = _command_line(block.text)
        if command not in shared_servers:
            shared_servers[command] = start_server(command, session.cwd, session.env, tmp_path_factory.mktemp("serve"))
        session.servers[command] = shared_servers[command]
    elif block.lang == "sh":
        result = session.shell(session.substitute(block.text))
        assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    elif block.lang == "console":
        for command, expected in console(session.substitute(block.text)):
            result = session.shell(f"{{ {command}\n}} 2>&1")
            assert result.returncode == 0, f"`{command}` exited {result.returncode}:\n{result.stdout[-3000:]}"
            assert matches(expected, result.stdout), f"`{command}` printed:\n{result.stdout}\nexpected:\n{expected}"
    else:
        assert block.lang == "python", block.lang
        result = subprocess.run([session.python(), "-"], input=session.substitute(block.text), cwd=session.cwd,
                                env=session.env, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, f"{session.python()} exited {result.returncode}:\n{result.stderr[-5000:]}"
    session.failed = ""


def test_every_runnable_block_is_collected() -> None:
    """The collector sees the blocks a reader sees: each fence of a page is paired, and none is missed."""
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        fences = [line for line in text.splitlines() if FENCE.match(line)]
        blocks = parse(page)[0]
        assert len(fences) == 2 * len(blocks), f"{page}: an unclosed or unpaired fence"
        for block in blocks:
            assert block.lang in RUN | {"", "toml", "yaml", "text"} or block.directive == "file", block.id
    assert any(b.page.name == "README.md" and b.lang == "python" for b in ALL)


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    """`make docs`: mkdocs with --strict (a broken link or anchor, a page left out of the nav, an API reference
    that does not resolve fail), into a folder of the test's."""
    result = subprocess.run(["make", "--no-print-directory", "docs", f"SITE={tmp_path / 'site'}"], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    assert (tmp_path / "site" / "api" / "index.html").read_text().count('id="oip.server.Model"') == 1
    assert "How the two transports relate" in (tmp_path / "site" / "spec" / "index.html").read_text()


def _slug(heading: str) -> str:
    """The anchor mkdocs (and GitHub, for these headings) gives a heading."""
    text = re.sub(r"[^\w\s-]", "", heading.replace("`", "")).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def test_readme_links_resolve() -> None:
    """README.md is read on its own (it is not part of the site): its links to docs/ name files and headings that
    exist."""
    text = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert links
    for link in links:
        path, _, anchor = link.partition("#")
        assert "://" not in path, link
        target = ROOT / path
        assert target.is_file(), link
        if anchor:
            headings = re.findall(r"^#+ (.+)$", target.read_text(), re.MULTILINE)
            assert anchor in {_slug(h) for h in headings}, link


def test_spec_readme_names_no_file_outside_the_repository() -> None:
    """`oipgen spec export` hands spec/ out, README included: it must not cite files of this machine."""
    for readme in sorted((ROOT / "spec").rglob("*.md")):
        text = readme.read_text()
        assert not re.search(r"(?<![\w.])/(?:work|home|root|tmp|Users|mnt|opt|srv)/", text), readme
        for token in re.findall(r"`([^`\s]+)`", text):
            if token.startswith(("/", "~", "../")):
                where = Path(os.path.expanduser(token)) if not token.startswith("../") else readme.parent / token
                assert not where.exists() or where.resolve().is_relative_to(ROOT), f"{readme}: {token}"


def test_generated_distributions_are_installed_by_path() -> None:
    """A generated distribution is named by its path wherever oipgen tells someone to install it (docs, the
    distribution's own pyproject.toml, its template, oipgen's messages): pip looks a bare name such as
    `generated[rest]` up on the package index, and installs whatever is published under it."""
    sources = [*PAGES, ROOT / "generated" / "pyproject.toml", *sorted((ROOT / "templates").rglob("*.jinja")),
               *sorted((ROOT / "oipgen").rglob("*.py"))]
    install = re.compile(r"pip (?:install|wheel)\b[^\n`]*?([\"' ])(?:-e )?([^\"' \n`]+?)\[(?:rest|grpc|server|all)\]")
    seen = 0
    for source in sources:
        for found in install.finditer(source.read_text(encoding="utf-8")):
            seen += 1
            assert found.group(2).startswith(("./", "../", "/", "~/")), f"{source}: {found.group(0)}"
    assert seen >= 6  # the README's, docs/install.md's table, the distribution's comment
