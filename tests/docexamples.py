"""The documented examples as a newcomer meets them: the shell blocks of README.md and docs/*.md,
and the example at the end of every verb's ``--help``, read from the text and run in order.

How a block says what it is (CONTRIBUTING.md, "Examples in the docs"): the line before a
fence may be ``<!-- runnable -->``, ``<!-- runnable: exit N -->`` (the block's last command is
expected to exit N, a refusal shown on purpose) or ``<!-- not run: WHY -->``. A shell block
(``sh``, ``bash``, ``console``) carries one of them; so does a ``python`` block outside
docs/api.md (whose blocks tests/test_docs.py runs). ``text`` and ``json`` blocks are output,
synopses and diagrams, never run. In a ``console`` block the commands are the ``$ `` lines,
the rest is what they print.

What a block needs that a newcomer has and the test does not (a checkpoint directory, a
config, a trainer, a bucket) comes from one table: ``GIVEN`` (files made before a document's
first block) and ``substitutions`` (placeholders in the text, replaced before a command is
parsed). A command that cannot run here at all is in ``NOT_HERE`` with the reason.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = ("README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")))

SHELL_INFOS = ("sh", "bash", "console")
#: Blocks that are never run and need no marker: output, synopses, diagrams.
PLAIN_INFOS = ("text", "json")
_FENCE = re.compile(r"^(?P<indent> *)```(?P<info>[^`]*)$")
_MARKER = re.compile(r"^\s*<!--\s*(?P<body>.*?)\s*-->\s*$")
_RUNNABLE = re.compile(r"^runnable(?::\s*exit (?P<exit>\d+))?$")
_NOT_RUN = re.compile(r"^not run:\s*(?P<reason>\S.*)$")
_UNSUPPORTED = re.compile(r"(?<![\\\w])(\|\|?|&&|;|<|2>|&\s*$)")


@dataclass(frozen=True)
class Block:
    """A fenced block of a document: where it starts (the fence's line), its info string,
    its text, and what the line before the fence says of it."""

    document: str
    line: int
    info: str
    text: str
    marker: str | None

    @property
    def where(self) -> str:
        return f"{self.document}:{self.line}" if self.line else self.document

    @property
    def runnable(self) -> bool:
        return self.marker is not None and _RUNNABLE.match(self.marker) is not None

    @property
    def expected_exit(self) -> int:
        match = _RUNNABLE.match(self.marker or "")
        return int(match.group("exit")) if match and match.group("exit") else 0

    @property
    def not_run_reason(self) -> str | None:
        match = _NOT_RUN.match(self.marker or "")
        return match.group("reason") if match else None


def blocks(document: str) -> list[Block]:
    """Every fenced block of ``document`` (a path relative to the repository), in order."""
    lines = (ROOT / document).read_text(encoding="utf-8").splitlines()
    out: list[Block] = []
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        indent = len(opening.group("indent"))
        end = index + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        if end == len(lines):
            raise AssertionError(f"{document}:{index + 1}: a fence that is never closed")
        body = "\n".join(line[indent:] for line in lines[index + 1 : end])
        before = index - 1
        while before >= 0 and not lines[before].strip():
            before -= 1
        marker = _MARKER.match(lines[before]) if before >= 0 else None
        out.append(
            Block(
                document,
                index + 1,
                opening.group("info").strip(),
                body,
                marker.group("body") if marker else None,
            )
        )
        index = end + 1
    return out


def loose_commands(document: str) -> list[str]:
    """Command lines outside any fence that a reader would take for an example: an indented
    code block of ``restorepoint`` commands, which would escape every marker."""
    inside = False
    found = []
    for number, line in enumerate((ROOT / document).read_text(encoding="utf-8").splitlines(), 1):
        if _FENCE.match(line) or (inside and line.strip() == "```"):
            inside = not inside
            continue
        if not inside and re.match(r"^ {4,}(\$ )?restorepoint [a-z]", line):
            found.append(f"{document}:{number}: {line.strip()}")
    return found


# -- commands ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Command:
    """One command of a block: its words (placeholders replaced), where its stdout goes, the
    exit status it must have."""

    where: str
    text: str
    argv: tuple[str, ...]
    stdout_to: str | None
    expected_exit: int


def command_texts(block: Block) -> list[str]:
    """The block's commands as written: continuation lines joined, comments and blank lines
    left out; in a ``console`` block only the ``$ `` lines."""
    lines = block.text.splitlines()
    if block.info == "console":
        lines = [line[2:] for line in lines if line.startswith("$ ")]
    out: list[str] = []
    pending = ""
    for line in lines:
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1].strip() + " "
            continue
        out.append(pending + line.strip())
        pending = ""
    if pending:
        raise AssertionError(f"{block.where}: the last line continues into nothing")
    return out


def parse(block: Block, substitute: Callable[[str], str]) -> list[Command]:
    """The block's commands, ready to run. A redirect of stdout (``> FILE``) at the end of a
    command is honoured; any other shell syntax is refused, so that a block the runner would
    misread fails loudly instead of running something else."""
    texts = command_texts(block)
    if not texts:
        raise AssertionError(f"{block.where}: a runnable block without a command")
    out = []
    for number, text in enumerate(texts):
        written = substitute(text)
        unquoted = re.sub(r"'[^']*'|\"[^\"]*\"", "", written.split("#", 1)[0])
        if _UNSUPPORTED.search(unquoted):
            raise AssertionError(
                f"{block.where}: {text!r}: shell syntax the runner does not interpret "
                "(mark the block not run, or teach tests/docexamples.py)"
            )
        words = shlex.split(written, comments=True)
        stdout_to = None
        if len(words) >= 2 and words[-2] == ">":
            stdout_to, words = words[-1], words[:-2]
        if any(w.startswith(">") or w == ">" for w in words):
            raise AssertionError(f"{block.where}: {text!r}: a redirect that is not at the end")
        expected = block.expected_exit if number == len(texts) - 1 else 0
        out.append(Command(block.where, text, tuple(words), stdout_to, expected))
    return out


# -- what the examples need ----------------------------------------------------------------

#: The trainer behind ``python train.py --config train.yaml``: a restorepoint.torch loop, as
#: small as one can be, so that the examples that start it (``run``) cost seconds.
TRAIN_PY = '''\
"""A small trainer on restorepoint's ResumableRun: python train.py --config train.yaml"""

import argparse

import torch

from restorepoint.torch import ResumableRun

parser = argparse.ArgumentParser()
parser.add_argument("--config", required=True)
args = parser.parse_args()
with ResumableRun(
    args.config, operational=["train.checkpoint_every"], snapshot_every="train.checkpoint_every"
) as run:
    model = torch.nn.Linear(4, 1)
    run.track(model=model)
    run.resume()
    for _epoch in run.epochs(run.config["epochs"]):
        for _batch in range(4):
            with torch.no_grad():
                model.weight -= run.config["lr"]
            run.commit()
'''

TRAIN_YAML = """\
lr: 0.01
seed: 7
epochs: 2
train:
  checkpoint_every: 4
"""

JOB_YAML = """\
scene: garden
train:
  checkpoint_every: 7000
"""


def _write(path: Path, content: str | bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")


def _images(where: Path) -> None:
    for name in ("IMG_0001.jpg", "IMG_0002.jpg", "sparse/cameras.bin"):
        _write(where / name, os.urandom(2048))


def _checkpoint(where: Path) -> None:
    _write(where / "model.pt", os.urandom(64 * 1024))
    _write(where / "optimizer.pt", bytes(16 * 1024))
    _write(where / "trainer_state.json", json.dumps({"global_step": 1500}))


def _lichtfeld_project(where: Path) -> None:
    """What LichtFeld Studio leaves in its output directory after a training run: committed
    checkpoints, announced in its log (the fake trainer, as the tests run it)."""
    scene = where.parent.parent / "scenes" / "garden"
    if not scene.exists():
        _images(scene)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "restorepoint.testing.fake_lichtfeld",
            "--headless",
            "-d",
            str(scene),
            "-o",
            str(where),
            "-i",
            "2000",
            "--save-steps",
            "500,1000,1500",
            "--log-file",
            str(where / "lichtfeld.log"),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )


@dataclass(frozen=True)
class Given:
    """Something the documents take for granted: what it stands for, and how the test makes it."""

    what: str
    make: Callable[[Path], None]


#: Relative to the directory the document's examples run in.
GIVEN: dict[str, Given] = {
    "checkpoints": Given("a trainer's checkpoint directory (CHECKPOINT_DIR)", _checkpoint),
    "train.yaml": Given("a training config", lambda p: _write(p, TRAIN_YAML)),
    "train.py": Given("a trainer on restorepoint.torch", lambda p: _write(p, TRAIN_PY)),
    "job.yaml": Given("a LichtFeld Studio job's config", lambda p: _write(p, JOB_YAML)),
    "data/garden": Given("a data directory (/data/garden)", _images),
    "scenes/garden": Given("a LichtFeld Studio scene (the trainer's -d)", _images),
    "runs/garden": Given(
        "a LichtFeld Studio project with committed checkpoints", _lichtfeld_project
    ),
}
#: Which documents find which of GIVEN (every document the ones not listed here).
GIVEN_ONLY_FOR = {"runs/garden": ("README.md", "docs/adapters.md")}

#: Commands that cannot run on this machine, by their first word.
NOT_HERE = {
    "sbatch": "submits to a Slurm cluster; tests/slurm submits the template's script to a real one",
}

#: The ``--help`` examples left unrun, and why.
HELP_NOT_RUN = {
    "snapshot": "asks a trainer that is running now; tests/preempt/test_snapshot_cli.py asks a "
    "live one",
    "demo": "trains three times (most of a minute); tests/runtime/test_demo.py runs it",
}


@dataclass(frozen=True)
class Placeholder:
    """A placeholder of the documents and what the test puts in its place."""

    text: str
    what: str
    value: Callable[[Workspace], str]


def _store(name: str) -> Callable[[Workspace], str]:
    # A bucket of the documents is a local directory, or a prefix of this test's moto bucket.
    return lambda ws: f"s3://{ws.bucket}/{name}/" if ws.bucket else f"{name}/"


#: Longest first where one contains another; every one is used by some runnable example.
PLACEHOLDERS = (
    Placeholder("s3://bucket/", "a bucket", _store("bucket")),
    Placeholder("s3://jobs/", "another bucket", _store("jobs")),
    Placeholder("CHECKPOINT_DIR", "a checkpoint directory", lambda ws: "checkpoints"),
    Placeholder("/data/garden", "a data directory", lambda ws: str(ws.cwd / "data" / "garden")),
    Placeholder(
        "/opt/lichtfeld/LichtFeld-Studio",
        "the LichtFeld Studio binary (the fake trainer)",
        lambda ws: str(ws.bin / "LichtFeld-Studio"),
    ),
    Placeholder(
        "--watch aws",
        "the instance metadata service (the AWS emulator, no notice armed)",
        lambda ws: f"--watch aws --metadata-url {ws.metadata_url}",
    ),
)


# -- running them --------------------------------------------------------------------------


@dataclass
class Result:
    command: Command
    code: int
    stdout: str
    stderr: str
    how: str  # "in-process", "subprocess" or "not run: ..."
    seconds: float = 0.0


@dataclass
class Workspace:
    """Where a document's examples run: a directory (the user's working directory), a bin
    directory on PATH (``python``, ``restorepoint``, the fake ``LichtFeld-Studio``), the store
    (``bucket`` None: local directories), the environment of every process started."""

    cwd: Path
    bin: Path
    env: dict[str, str]
    bucket: str | None = None
    metadata_url: str = "http://127.0.0.1:9"
    results: list[Result] = field(default_factory=list)

    def substitute(self, text: str) -> str:
        for placeholder in PLACEHOLDERS:
            text = text.replace(placeholder.text, placeholder.value(self))
        return text

    def give(self, document: str) -> None:
        for name, given in GIVEN.items():
            if document in GIVEN_ONLY_FOR.get(name, (document,)):
                given.make(self.cwd / name)

    def run_block(self, block: Block) -> None:
        for command in parse(block, self.substitute):
            # Every bucket of the documents is replaced: the S3 run reaches moto only, the
            # local run no S3 at all.
            buckets = set(re.findall(r"s3://([^/\s]+)/", shlex.join(command.argv)))
            if buckets - {self.bucket}:
                raise AssertionError(
                    f"{command.where}: `{command.text}`: a bucket that no placeholder replaces"
                )
            result = self.run(command)
            self.results.append(result)
            if result.code != command.expected_exit:
                raise AssertionError(
                    f"{command.where}: `{command.text}` exited {result.code}, the document "
                    f"expects {command.expected_exit} ({result.how}: {shlex.join(command.argv)})"
                    f"\n--- stdout\n{result.stdout[-3000:]}\n--- stderr\n{result.stderr[-3000:]}"
                )

    def run(self, command: Command) -> Result:
        started = time.monotonic()
        result = self._run(command)
        result.seconds = time.monotonic() - started
        if os.environ.get("DOC_EXAMPLES_TIMES"):
            print(f"{result.seconds:6.2f} s  {result.how:10.10}  {command.where}: {command.text}")
        return result

    def _run(self, command: Command) -> Result:
        first = command.argv[0]
        if first in NOT_HERE:
            return Result(command, command.expected_exit, "", "", f"not run: {NOT_HERE[first]}")
        if first == "restorepoint" and _in_process(command.argv):
            code, out, err = _run_in_process(list(command.argv[1:]))
            how = "in-process"
        else:
            proc = subprocess.run(
                list(command.argv),
                cwd=self.cwd,
                env=self.env,
                capture_output=True,
                text=True,
                timeout=180,
                check=False,
            )
            code, out, err, how = proc.returncode, proc.stdout, proc.stderr, "subprocess"
        if command.stdout_to is not None:
            _write(self.cwd / command.stdout_to, out)
        return Result(command, code, out, err, how)


#: Verbs that run a trainer or replace the process: a process of their own, as a user's shell
#: would start. Every other ``restorepoint`` command runs in this process (the same main() as
#: the console script), which is what keeps this test to seconds.
_OWN_PROCESS = {"run", "demo"}


def _in_process(argv: tuple[str, ...]) -> bool:
    return len(argv) > 1 and argv[1] not in _OWN_PROCESS and "--exec" not in argv


def _run_in_process(args: list[str]) -> tuple[int, str, str]:
    from restorepoint._cli import main

    out, err = io.StringIO(), io.StringIO()
    code: int = 0
    # Warnings are shown as a user's terminal shows them, never turned into errors.
    with (
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("default")
        try:
            main(args)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return code, out.getvalue(), err.getvalue()


def make_bin(where: Path) -> Path:
    """``python`` (this interpreter), ``restorepoint`` and the fake ``LichtFeld-Studio``, as a
    newcomer's PATH has them."""
    where.mkdir(parents=True, exist_ok=True)
    scripts = {
        "python": f'exec {shlex.quote(sys.executable)} "$@"\n',
        "restorepoint": f'exec {shlex.quote(sys.executable)} -m restorepoint "$@"\n',
        "LichtFeld-Studio": (
            f'exec {shlex.quote(sys.executable)} -m restorepoint.testing.fake_lichtfeld "$@"\n'
        ),
    }
    for name, body in scripts.items():
        path = where / name
        path.write_text("#!/bin/sh\n" + body, encoding="utf-8")
        path.chmod(0o755)
    return where


def help_examples() -> Iterator[tuple[str, Block]]:
    """Every verb's ``--help`` example as a one-command block, in the order of the help."""
    from restorepoint._cli._app import EXAMPLES

    for verb, example in EXAMPLES.items():
        yield verb, Block(f"restorepoint {verb} --help", 0, "sh", example, "runnable")
