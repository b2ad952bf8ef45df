"""Every example a newcomer meets runs as written, in the order shown: the runnable shell blocks
of README.md and docs/*.md, and the example of every verb's ``--help``, against a local store
and against moto's S3 server. The conventions are in tests/docexamples.py and CONTRIBUTING.md."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from docexamples import (
    DOCUMENTS,
    HELP_NOT_RUN,
    NOT_HERE,
    PLACEHOLDERS,
    PLAIN_INFOS,
    SHELL_INFOS,
    Block,
    Workspace,
    blocks,
    command_texts,
    help_examples,
    loose_commands,
    make_bin,
)

RUNNABLE_DOCUMENTS = [d for d in DOCUMENTS if any(b.runnable for b in blocks(d))]
STORES = ["local", pytest.param("s3", marks=pytest.mark.s3)]


def _store(request: pytest.FixtureRequest, kind: str) -> dict[str, Any] | None:
    """None for local stores, else this test's moto bucket and the s3fs options to reach it."""
    if kind == "local":
        return None
    return {
        "bucket": request.getfixturevalue("s3_bucket"),
        "options": request.getfixturevalue("s3_storage_options"),
    }


@contextlib.contextmanager
def _workspace(
    where: Path, monkeypatch: pytest.MonkeyPatch, store: dict[str, Any] | None
) -> Iterator[Workspace]:
    """A newcomer's shell: an empty working directory, PATH with ``python``, ``restorepoint``
    and the fake ``LichtFeld-Studio``, no restorepoint, AWS or fsspec setting of this machine,
    and the store's credentials where the commands (in this process and started) find them."""
    from _servers.s3 import s3_env_for

    cwd = where / "work"
    cwd.mkdir(parents=True)
    bin_dir = make_bin(where / "bin")
    with monkeypatch.context() as patch:
        patch.chdir(cwd)
        for name in list(os.environ):
            if name.startswith(("RESTOREPOINT_", "AWS_", "FSSPEC_", "SUBMITIT_")):
                patch.delenv(name)
        patch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # never ask a metadata service
        patch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
        bucket = None
        if store is not None:
            import fsspec.config

            # The commands run here read it as s3fs's defaults; the processes started get
            # the same from FSSPEC_S3, which fsspec reads when it is imported.
            patch.setitem(fsspec.config.conf, "s3", store["options"])
            env = s3_env_for(store["options"])
            bucket = store["bucket"]
        else:
            env = dict(os.environ)
        yield Workspace(cwd, bin_dir, env, bucket)


@pytest.fixture(params=STORES)
def workspace(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Workspace]:
    with _workspace(tmp_path, monkeypatch, _store(request, request.param)) as ws:
        yield ws


def _aws(workspace: Workspace, texts: list[str]) -> Any:
    from preempt.emulators import AwsEmulator

    if not any("--watch aws" in text for text in texts):
        return None
    emulator = AwsEmulator().start()
    workspace.metadata_url = emulator.url
    return emulator


def _run(workspace: Workspace, document: str, runnable: list[Block]) -> None:
    workspace.give(document)
    emulator = _aws(workspace, [b.text for b in runnable])
    try:
        for block in runnable:
            workspace.run_block(block)
    finally:
        if emulator is not None:
            emulator.stop()


# -- the documents say which blocks run --------------------------------------------------


@pytest.mark.parametrize("document", DOCUMENTS)
def test_every_block_says_whether_it_runs(document: str) -> None:
    problems = [f"{line} (an indented example: fence it)" for line in loose_commands(document)]
    for block in blocks(document):
        if block.marker is not None and not (block.runnable or block.not_run_reason):
            problems.append(f"{block.where}: a marker that says neither runnable nor not run")
        elif block.info in SHELL_INFOS:
            if block.marker is None:
                problems.append(f"{block.where}: a {block.info} block without a marker")
        elif block.info == "python":
            if document != "docs/api.md" and block.not_run_reason is None:
                problems.append(f"{block.where}: a python block outside docs/api.md runs nowhere")
        elif block.info in PLAIN_INFOS:
            if block.marker is not None:
                problems.append(f"{block.where}: a {block.info} block is never run: no marker")
            if any(line.startswith("$ ") for line in block.text.splitlines()):
                problems.append(f"{block.where}: a {block.info} block with a $ command")
        else:
            problems.append(f"{block.where}: info string {block.info!r}: use sh, text, ...")
    assert problems == []


def test_every_placeholder_and_skip_is_used() -> None:
    from restorepoint._cli._app import EXAMPLES

    texts = [b.text for d in DOCUMENTS for b in blocks(d) if b.runnable]
    texts += [b.text for _, b in help_examples()]
    assert [p.text for p in PLACEHOLDERS if not any(p.text in t for t in texts)] == []
    commands = [c.split()[0] for b in (b for d in DOCUMENTS for b in blocks(d)) if b.runnable
                for c in command_texts(b)]  # fmt: skip
    assert [name for name in NOT_HERE if name not in commands] == []
    assert set(HELP_NOT_RUN) <= set(EXAMPLES)
    assert RUNNABLE_DOCUMENTS  # the test runs something


# -- they run ------------------------------------------------------------------------------


@pytest.mark.parametrize("document", RUNNABLE_DOCUMENTS)
def test_document_examples_run_in_order(document: str, workspace: Workspace) -> None:
    _run(workspace, document, [b for b in blocks(document) if b.runnable])
    assert workspace.results
    if workspace.bucket is not None and any("s3://" in r.command.text for r in workspace.results):
        import fsspec

        assert fsspec.filesystem("s3").find(workspace.bucket)  # it went to moto


@pytest.mark.s3
def test_help_examples_run_in_order(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Both stores in one test, so that one process pays for what `adapters` and
    # `local-view --adapter torch` import (Lightning, torch), not one per xdist worker.
    runnable = [block for verb, block in help_examples() if verb not in HELP_NOT_RUN]
    for kind in ("local", "s3"):
        with _workspace(tmp_path / kind, monkeypatch, _store(request, kind)) as ws:
            _run(ws, "--help", runnable)
            assert len(ws.results) == len(runnable), kind
            if ws.bucket is not None:
                import fsspec

                assert fsspec.filesystem("s3").find(ws.bucket)  # it went to moto


# -- and a broken one fails ----------------------------------------------------------------


def test_a_broken_example_fails_the_test(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    ws = Workspace(tmp_path, make_bin(tmp_path / "bin"), dict(os.environ))

    def block(text: str, marker: str = "runnable") -> Block:
        return Block("doc.md", 7, "sh", text, marker)

    with pytest.raises(AssertionError, match=r"doc.md:7: .* exited 4, the document expects 0"):
        ws.run_block(block("restorepoint verify missing.rp"))
    ws.run_block(block("restorepoint verify missing.rp", "runnable: exit 4"))
    with pytest.raises(AssertionError, match=r"exited 0, the document expects 3"):
        ws.run_block(block("restorepoint --version", "runnable: exit 3"))
    with pytest.raises(AssertionError, match="shell syntax the runner does not interpret"):
        ws.run_block(block("restorepoint list store/ | head -1"))
    with pytest.raises(AssertionError, match=r"exited 1, the document expects 0 \(subprocess"):
        ws.run_block(block("python -c 'raise SystemExit(1)'"))
