"""The trust options as a user meets them: keygen, pack --sign --encrypt-to, verify / check /
import with --trust, --require-signature and --identity; each failure one line and its exit code
(1 for a signature or decryption refusal, 2 for a bad option or key file, 3 for the gate)."""

from __future__ import annotations

import json
import stat
from dataclasses import dataclass
from pathlib import Path

import pytest
from clirun import cli, one_error_line

import restorepoint
from restorepoint.trust import generate, load_public


@dataclass(frozen=True)
class Keys:
    root: Path

    def __getitem__(self, name: str) -> str:
        return str(self.root / name)


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    """signer and recipient by the CLI (tested below); the others by the library."""
    root = tmp_path_factory.mktemp("keys")
    for name, kind in (("signer", "signing"), ("recipient", "encryption")):
        proc = cli("keygen", str(root / name), "--for", kind)
        assert proc.returncode == 0, proc.stderr
    generate(root / "stranger", "signing")
    generate(root / "outsider", "encryption")
    return Keys(root)


def kid(keys: Keys, name: str, kind: str = "signing") -> str:
    return load_public(keys[name] + ".pub", kind).key_id  # type: ignore[arg-type]


@dataclass(frozen=True)
class Packed:
    source: Path
    sealed: str  # signed by signer, encrypted to recipient, by the CLI
    unsigned: str  # neither
    untrusted: str  # signed by stranger


@pytest.fixture(scope="module")
def packed(keys: Keys, tmp_path_factory: pytest.TempPathFactory) -> Packed:
    root = tmp_path_factory.mktemp("packed")
    source = root / "ckpt"
    (source / "sub").mkdir(parents=True)
    (source / "model.bin").write_bytes(bytes(range(256)) * 1000)
    (source / "sub" / "state.json").write_text('{"step": 7}')
    sealed = str(root / "sealed.rp")
    proc = cli(
        "pack", str(source), sealed, "--step", "7", "--term", "cuda=12.4",
        "--sign", keys["signer"], "--encrypt-to", keys["recipient"] + ".pub", "--json",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["ok"] is True
    common = {"position": 7, "terms": {"cuda": "12.4"}}
    unsigned = str(root / "unsigned.rp")
    restorepoint.pack(source, unsigned, **common)  # type: ignore[arg-type]
    untrusted = str(root / "untrusted.rp")
    stranger = restorepoint.trust.load_signing_key(keys["stranger"])
    restorepoint.pack(source, untrusted, sign=[stranger], **common)  # type: ignore[arg-type]
    return Packed(source, sealed, unsigned, untrusted)


# -- keygen ---------------------------------------------------------------------------------


def test_keygen_human(tmp_path: Path) -> None:
    """Into a directory that does not exist yet: made, as pack makes its destination's."""
    out = tmp_path / "keys" / "fleet" / "k"
    proc = cli("keygen", str(out))
    assert proc.returncode == 0, proc.stderr
    key_id = load_public(str(out) + ".pub", "signing").key_id
    assert proc.stdout == f"signing key {key_id}: {out} (keep it secret), {out}.pub\n"
    assert proc.stderr == ""
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert stat.S_IMODE(out.parent.stat().st_mode) == 0o700
    # A file where the directory should be: one line, exit 2.
    proc = cli("keygen", str(out / "k2"))
    assert proc.returncode == 2
    assert "cannot make the key's directory" in one_error_line(proc)


def test_keygen_json_for_encryption(tmp_path: Path) -> None:
    out = tmp_path / "e"
    proc = cli("keygen", str(out), "--for", "encryption", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc == {
        "key_id": load_public(str(out) + ".pub", "encryption").key_id,
        "kind": "encryption",
        "ok": True,
        "private": str(out),
        "public": f"{out}.pub",
    }


def test_keygen_bad_kind_is_a_usage_error(tmp_path: Path) -> None:
    proc = cli("keygen", str(tmp_path / "k"), "--for", "rsa")
    assert proc.returncode == 2
    assert "--for must be signing or encryption" in one_error_line(proc)
    assert list(tmp_path.iterdir()) == []


def test_keygen_does_not_overwrite(tmp_path: Path) -> None:
    (tmp_path / "k.pub").write_text("mine")
    proc = cli("keygen", str(tmp_path / "k"), "--json")
    assert proc.returncode == 2
    assert "not overwriting" in one_error_line(proc)
    assert json.loads(proc.stdout)["error"]["class"] == "UsageError"
    assert (tmp_path / "k.pub").read_text() == "mine"
    assert not (tmp_path / "k").exists()


# -- verify ---------------------------------------------------------------------------------


def test_verify_with_every_option(keys: Keys, packed: Packed) -> None:
    proc = cli(
        "verify", packed.sealed, "--trust", keys["signer"] + ".pub", "--require-signature",
        "--identity", keys["recipient"],
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    signer = kid(keys, "signer")
    assert proc.stdout.splitlines()[1] == f"signed by {signer} (trusted: {signer})"
    assert proc.stderr == ""


def test_verify_json_names_signer_and_encryption(keys: Keys, packed: Packed) -> None:
    proc = cli(
        "verify", packed.sealed, "--trust", keys["signer"] + ".pub", "--trust",
        keys["stranger"] + ".pub", "--identity", keys["recipient"], "--json",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["ok"] is True
    assert out["encrypted"] is True
    assert out["signed_by"] == out["trusted_by"] == [kid(keys, "signer")]


@pytest.mark.parametrize(
    ("case", "needle", "klass"),
    [
        ("untrusted", "not signed by a trusted key", "SignatureError"),
        ("unsigned-required", "a signature is required", "SignatureError"),
        ("wrong-identity", "not a recipient", "DecryptionError"),
        ("no-identity", "give the recipient's key (--identity KEY)", "DecryptionError"),
    ],
)
def test_verify_refusals_exit_1_with_one_line(
    keys: Keys, packed: Packed, case: str, needle: str, klass: str
) -> None:
    trust = ("--trust", keys["signer"] + ".pub", "--require-signature")
    args = {
        "untrusted": (packed.untrusted, *trust),
        "unsigned-required": (packed.unsigned, *trust),
        "wrong-identity": (packed.sealed, *trust, "--identity", keys["outsider"]),
        "no-identity": (packed.sealed, *trust),
    }[case]
    proc = cli("verify", *args)
    assert proc.returncode == 1
    line = one_error_line(proc)
    assert line.startswith("restorepoint: error: ")
    assert needle in line
    assert proc.stdout == ""
    proc = cli("verify", *args, "--json")
    assert proc.returncode == 1
    error = json.loads(proc.stdout)["error"]
    assert (error["class"], error["exit_code"]) == (klass, 1)


@pytest.mark.parametrize(
    ("args", "needle", "code"),
    [
        (("--require-signature",), "--require-signature needs --trust", 2),
        (("--identity", "{signer}"), "not an encryption key", 2),
        (("--trust", "{recipient}.pub"), "not a signing public key", 2),
        # A key file that is not there is NotFound, a storage error like any missing file.
        (("--trust", "{root}/absent.pub"), "key file not found", 4),
    ],
)
def test_verify_bad_trust_options(
    keys: Keys, packed: Packed, args: tuple[str, ...], needle: str, code: int
) -> None:
    filled = [
        a.format(signer=keys["signer"], recipient=keys["recipient"], root=keys.root) for a in args
    ]
    proc = cli("verify", packed.sealed, *filled)
    assert proc.returncode == code
    assert needle in one_error_line(proc)


# -- check ----------------------------------------------------------------------------------


def test_check_with_a_signature_policy(keys: Keys, packed: Packed) -> None:
    policy = ("--trust", keys["signer"] + ".pub", "--require-signature")
    proc = cli("check", packed.sealed, "--term", "cuda=12.4", *policy)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("compatible (head only; --verify checks the payload): step 7")
    # --verify reads the encrypted payload: it needs the recipient's key, as verify does.
    proc = cli("check", packed.sealed, "--term", "cuda=12.4", *policy, "--verify")
    assert proc.returncode == 1
    assert "--identity" in one_error_line(proc)
    proc = cli(
        "check", packed.sealed, "--term", "cuda=12.4", *policy, "--verify",
        "--identity", keys["recipient"],
    )  # fmt: skip
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout.startswith("compatible and verified: step 7 at ")
    proc = cli("check", packed.unsigned, "--term", "cuda=12.4", *policy)
    assert proc.returncode == 1
    assert "a signature is required" in one_error_line(proc)
    proc = cli("check", packed.untrusted, "--term", "cuda=12.4", *policy, "--json")
    assert proc.returncode == 1
    assert json.loads(proc.stdout)["error"]["class"] == "SignatureError"
    # Signed and trusted, but another CUDA: the gate's refusal, exit 3.
    proc = cli("check", packed.sealed, "--term", "cuda=11.8", *policy)
    assert proc.returncode == 3
    assert "terms.cuda: here 11.8 (--term), in the restore point 12.4" in proc.stderr


# -- import ---------------------------------------------------------------------------------


def test_import_with_identity(keys: Keys, packed: Packed, tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    proc = cli(
        "import", packed.sealed, str(dest), "--trust", keys["signer"] + ".pub",
        "--require-signature", "--identity", keys["recipient"], "--json",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["ok"] is True
    for rel in ("model.bin", "sub/state.json"):
        assert (dest / rel).read_bytes() == (packed.source / rel).read_bytes()


@pytest.mark.parametrize(
    ("identity", "needle"), [(None, "(--identity KEY)"), ("outsider", "not a recipient")]
)
def test_import_without_the_right_identity_writes_nothing(
    keys: Keys, packed: Packed, tmp_path: Path, identity: str | None, needle: str
) -> None:
    extra = ("--identity", keys[identity]) if identity else ()
    proc = cli("import", packed.sealed, str(tmp_path / "dest"), *extra)
    assert proc.returncode == 1
    assert needle in one_error_line(proc)
    assert list(tmp_path.iterdir()) == []


def test_import_unsigned_with_require_writes_nothing(
    keys: Keys, packed: Packed, tmp_path: Path
) -> None:
    proc = cli(
        "import", packed.unsigned, str(tmp_path / "dest"), "--trust", keys["signer"] + ".pub",
        "--require-signature",
    )  # fmt: skip
    assert proc.returncode == 1
    assert "a signature is required" in one_error_line(proc)
    assert list(tmp_path.iterdir()) == []
