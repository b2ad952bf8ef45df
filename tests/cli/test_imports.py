"""What each entry point imports: a fresh interpreter runs it and reports ``sys.modules``.

Start-up is the interpreter plus what it imports, so the modules are pinned here, not a time
(the machines are noisy): ``import restorepoint`` and ``--version`` load next to nothing,
``--help`` loads typer and the verbs' option tables but none of what a verb does, and a verb
loads what it uses and nothing it does not (no torch to verify, no YAML without a config)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from restorepoint import pack
from restorepoint._cli._app import EXAMPLES, app

#: Run an entry point in this interpreter, then print the modules it loaded as JSON on the
#: last line (a verb's own output comes first).
_PROBE = """
import json, sys
mode = sys.argv[1]
try:
    if mode == "import":
        exec(sys.argv[2])
    else:
        from restorepoint._cli import main
        sys.argv = ["restorepoint", *sys.argv[2:]]
        main()
except SystemExit:
    pass
sys.stdout.write("\\n" + json.dumps(sorted(sys.modules)) + "\\n")
"""

HEAVY = (
    "torch",
    "lightning",
    "transformers",
    "accelerate",
    "datasets",
    "numpy",
    "yaml",
    "fsspec.implementations",
    "s3fs",
    "gcsfs",
    "botocore",
)
#: restorepoint's own subsystems that no start-up needs.
SUBSYSTEMS = (
    "restorepoint.preempt",
    "restorepoint.runtime",
    "restorepoint.adapters",  # and with it the entry points of installed adapters
    "restorepoint.slurm",
    "restorepoint.testing",
)


def loaded(mode: str, *args: str, cwd: Path | None = None) -> set[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RESTOREPOINT_", "FSSPEC_"))}
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, mode, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=cwd,
        check=False,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return set(json.loads(proc.stdout.strip().splitlines()[-1]))


def under(modules: set[str], prefixes: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == p or m.startswith(p + ".") for p in prefixes))


def test_import_restorepoint_loads_only_the_errors_and_the_version() -> None:
    modules = loaded("import", "import restorepoint")
    assert under(modules, HEAVY + SUBSYSTEMS) == []
    # Not even the format or the storage layer: the public names load on first use.
    assert under(modules, ("restorepoint.format", "restorepoint.ops", "restorepoint.storage")) == []
    assert under(modules, ("typer", "zstandard", "cryptography", "rfc8785")) == []
    assert {"restorepoint", "restorepoint.errors", "restorepoint._version"} <= modules


def test_a_public_name_loads_its_module_on_first_use() -> None:
    modules = loaded("import", "import restorepoint; restorepoint.verify")
    assert "restorepoint.ops.verify" in modules
    assert under(modules, HEAVY + SUBSYSTEMS) == []


def test_a_name_shared_with_its_module_stays_the_function_whatever_loads_first() -> None:
    # restorepoint.ops resolves its names lazily; the import system binds a submodule to its
    # package's attribute when it loads, and pack, publish and verify are both.
    code = (
        "import restorepoint.ops.verify, restorepoint.ops.pack, restorepoint.ops.publish\n"
        "import restorepoint.ops as ops\n"
        "from restorepoint.ops import pack, publish, verify\n"
        "assert all(callable(f) for f in (pack, publish, verify, ops.pack, ops.verify))\n"
        "assert ops.verify.__module__ == 'restorepoint.ops.verify'\n"
        "import restorepoint\n"
        "assert restorepoint.pack is pack and restorepoint.verify is verify\n"
    )
    modules = loaded("import", code)
    assert "restorepoint.ops.publish" in modules


def test_version_loads_neither_typer_nor_any_verb() -> None:
    modules = loaded("cli", "--version")
    assert under(modules, HEAVY + SUBSYSTEMS) == []
    assert under(modules, ("typer", "restorepoint._cli._app", "restorepoint.format")) == []


@pytest.mark.parametrize("verb", [None, *EXAMPLES])
def test_help_loads_no_subsystem(verb: str | None) -> None:
    modules = loaded("cli", *([verb] if verb else []), "--help")
    assert "restorepoint._cli._app" in modules  # the help was really built
    assert under(modules, HEAVY + SUBSYSTEMS) == []
    assert under(modules, ("restorepoint.ops", "restorepoint.storage", "restorepoint.trust")) == []
    assert "restorepoint.preempt.supervisor" not in modules


@pytest.fixture(scope="module")
def local_restore_point(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("imports")
    source = root / "ckpt"
    source.mkdir()
    (source / "model.bin").write_bytes(os.urandom(4096))
    return Path(pack(source, root / "store/", position=3, run="r", into_store=True).url)


@pytest.mark.parametrize(
    "args",
    [
        ["verify", "{rp}"],
        ["inspect", "{rp}"],
        ["list", "{store}"],
        ["latest", "{store}"],
        ["check", "{rp}", "--term", "torch=2.13"],
        ["prune", "{store}", "--keep-last", "1", "--dry-run"],
        ["fsck", "{store}", "--read-data"],
    ],
    ids=lambda a: a[0],
)
def test_a_verb_on_a_local_store_loads_no_trainer_and_no_cloud(
    args: list[str], local_restore_point: Path
) -> None:
    values = {"rp": str(local_restore_point), "store": str(local_restore_point.parent.parent)}
    modules = loaded("cli", *(a.format(**values) for a in args))
    assert "restorepoint.ops" in modules  # it really ran
    assert under(modules, HEAVY + SUBSYSTEMS) == []


#: What a verify of a local, unsigned, unencrypted restore point needs none of: the other
#: operations (pack, publish, prune, the gate, import, the config loader), the event loop (a
#: retry of a cloud store), and cryptography (keys, signatures, ciphers).
NOT_FOR_VERIFY = (
    "restorepoint.ops._config",
    "restorepoint.ops.gate",
    "restorepoint.ops.handoff",
    "restorepoint.ops.pack",
    "restorepoint.ops.publish",
    "restorepoint.ops.store",
    "restorepoint.ops.unpack",
    "restorepoint.trust.encryption",
    "restorepoint.trust.keys",
    "asyncio",
    "cryptography",
)


def test_verify_loads_the_reader_and_nothing_it_does_not_use(local_restore_point: Path) -> None:
    modules = loaded("cli", "verify", str(local_restore_point))
    assert {"restorepoint.ops.verify", "restorepoint.format.reader"} <= modules  # it ran
    assert under(modules, NOT_FOR_VERIFY + HEAVY + SUBSYSTEMS) == []
    # The same through the library's public name.
    modules = loaded(
        "import", f"import restorepoint; restorepoint.verify({str(local_restore_point)!r})"
    )
    assert under(modules, NOT_FOR_VERIFY + HEAVY + SUBSYSTEMS) == []


def test_pack_loads_yaml_only_for_a_yaml_config(tmp_path: Path) -> None:
    source = tmp_path / "ckpt"
    source.mkdir()
    (source / "w.bin").write_bytes(b"w" * 100)
    plain = loaded("cli", "pack", str(source), str(tmp_path / "a.rp"), "--step", "1")
    assert "restorepoint.ops.pack" in plain
    assert under(plain, HEAVY + SUBSYSTEMS) == []
    # Neither signed nor encrypted, and to a local file: no cryptography, no event loop.
    assert under(plain, ("cryptography", "asyncio", "restorepoint.trust.keys")) == []
    config = tmp_path / "train.yaml"
    config.write_text("lr: 0.1\n")
    with_config = loaded(
        "cli", "pack", str(source), str(tmp_path / "b.rp"), "--step", "1", "--config", str(config)
    )
    assert "yaml" in with_config
    assert (tmp_path / "b.rp").is_file()


def test_the_torch_runtime_loads_torch_but_no_lightning_and_no_supervisor() -> None:
    pytest.importorskip("torch")
    modules = loaded("import", "import restorepoint.torch")
    assert "torch" in modules
    assert under(modules, ("lightning", "restorepoint.preempt", "restorepoint.adapters")) == []


# -- the help as a newcomer meets it -------------------------------------------------------


@pytest.mark.parametrize("verb", list(EXAMPLES))
def test_every_verb_has_an_example_that_parses(verb: str) -> None:
    example = EXAMPLES[verb]
    words = shlex.split(example)
    assert words[:2] == ["restorepoint", verb]
    root = typer.main.get_command(app)
    assert isinstance(root, typer.core.TyperGroup)
    command = root.get_command(root.make_context("restorepoint", [verb, "--help"]), verb)
    assert command is not None
    # Parsing validates every option and argument (names, types, counts) without running it.
    with command.make_context(verb, words[2:]) as ctx:
        assert ctx.params
    assert command.epilog == f"Example: {example}"


def test_every_verb_is_in_the_examples() -> None:
    root = typer.main.get_command(app)
    assert isinstance(root, typer.core.TyperGroup)
    assert set(root.commands) == set(EXAMPLES)


def test_the_example_is_at_the_end_of_the_help() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "restorepoint", "prune", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
        check=True,
    )
    assert "Example: " + EXAMPLES["prune"] in proc.stdout
    assert "default 24h" in proc.stdout


def test_shell_completion_completes_verbs_and_options(tmp_path: Path) -> None:
    def complete(words: str, index: int) -> list[str]:
        env = {
            **os.environ,
            "_RESTOREPOINT_COMPLETE": "complete_bash",
            "COMP_WORDS": words,
            "COMP_CWORD": str(index),
        }
        proc = subprocess.run(
            [sys.executable, "-m", "restorepoint"],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.split()

    assert complete("restorepoint pa", 1) == ["pack"]
    assert set(complete("restorepoint prune --keep", 2)) == {
        "--keep-last",
        "--keep-every",
        "--keep-within",
        "--keep-best",
    }
    # --install-completion writes the user's shell files (here: a scratch home).
    home = tmp_path / "home"
    home.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "restorepoint", "--install-completion", "bash"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "HOME": str(home), "SHELL": "/bin/bash"},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "restorepoint" in (home / ".bashrc").read_text()
