"""gs:// without credentials: one line, exit 4, at once. gcsfs, given no token, asked a GCE
metadata server that is not there again and again (15 s), went anonymous, retried the request
six times more (33 s without a network), and logged a 100-line traceback that the CLI, which
set up no logging, printed through logging's last resort. restorepoint now finds credentials
itself (google.auth, as gcloud does) and refuses at once when there are none, as on S3; what
the storage libraries log is kept off the terminal."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from clirun import cli, one_error_line

pytest.importorskip("gcsfs")

from restorepoint import PermissionDenied
from restorepoint.storage import FsspecLocation, resolve


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def no_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """An environment where Google's libraries find no credentials: no variables, an empty
    home and gcloud configuration, and a metadata server that refuses connections (as on any
    machine that is not a Google VM, without waiting for a silent network)."""
    home = tmp_path / "home"
    (home / "gcloud").mkdir(parents=True)
    metadata = f"127.0.0.1:{_closed_port()}"
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("FSSPEC_", "GOOGLE_", "CLOUDSDK_", "GCE_"))
        and k != "STORAGE_EMULATOR_HOST"
    }
    env.update(
        HOME=str(home),
        CLOUDSDK_CONFIG=str(home / "gcloud"),
        GCE_METADATA_HOST=metadata,
        GCE_METADATA_IP=metadata,
    )
    for name in list(os.environ):
        if name not in env:
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


@pytest.mark.parametrize(
    "args",
    [
        ["verify", "gs://some-bucket/x.rp"],
        ["inspect", "gs://some-bucket/x.rp"],
        ["check", "gs://some-bucket/x.rp", "--term", "a=b"],
        ["list", "gs://some-bucket/store/"],
    ],
    ids=lambda a: a[0],
)
def test_cli_without_credentials_is_one_line_exit_4_at_once(
    no_credentials: dict[str, str], args: list[str]
) -> None:
    # 48 s here before; under a second now. The timeout fails a run that waits for retries.
    proc = cli(*args, "--json", env=no_credentials, timeout=30)
    assert proc.returncode == 4, proc.stderr
    line = one_error_line(proc)
    assert line.startswith(f"restorepoint: error: {args[1]}: no Google Cloud credentials found")
    assert "FSSPEC_GCS_TOKEN=anon" in line
    error = json.loads(proc.stdout)["error"]
    assert (error["class"], error["exit_code"]) == ("PermissionDenied", 4)


def test_credentials_found_are_handed_to_gcsfs(
    no_credentials: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    account = {
        "type": "service_account",
        "project_id": "rp-project",
        "private_key_id": "0",
        "private_key": pem,
        "client_email": "rp@rp-project.iam.gserviceaccount.com",
        "client_id": "0",
        "token_uri": "https://oauth2.googleapis.com/token",
    }
    path = tmp_path / "account.json"
    path.write_text(json.dumps(account))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(path))
    location = resolve("gs://some-bucket/x.rp")
    assert isinstance(location, FsspecLocation)
    credentials: Any = location.fs.credentials.credentials
    assert credentials.service_account_email == account["client_email"]
    assert location.fs.project == "rp-project"


@pytest.mark.parametrize("how", ["option", "environment"])
def test_an_explicit_token_is_left_to_gcsfs(
    no_credentials: dict[str, str], monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    # Anonymous access to a public bucket is asked for, not fallen back to.
    with pytest.raises(PermissionDenied):
        resolve("gs://some-bucket/x.rp", {"project": "p"})
    if how == "option":
        location = resolve("gs://some-bucket/x.rp", {"token": "anon"})
    else:
        import fsspec.config

        monkeypatch.setitem(fsspec.config.conf, "gcs", {"token": "anon"})
        location = resolve("gs://some-bucket/x.rp")
    assert isinstance(location, FsspecLocation)
    assert location.fs.credentials.method == "anon"


@pytest.mark.parametrize("debug", [False, True])
def test_what_storage_libraries_log_stays_off_the_terminal(debug: bool) -> None:
    # gcsfs logs a traceback (logger.exception) for every request it gives up on, before the
    # error reaches restorepoint, which reports it in one line. Reproduced here without a
    # network: the verb's call logs as gcsfs does, then fails as the storage does.
    code = (
        "import logging\n"
        "import restorepoint.ops as ops\n"
        "from restorepoint.errors import StorageUnavailable\n"
        "def failing(url, **kw):\n"
        "    try:\n"
        "        raise ConnectionError('Cannot connect to host storage.googleapis.com')\n"
        "    except ConnectionError:\n"
        "        logging.getLogger('gcsfs').exception('_request out of retries on exception')\n"
        "    raise StorageUnavailable('storage unreachable or failing', url=url)\n"
        "ops.verify = failing  # what the verb calls\n"
        "from restorepoint._cli import main\n"
        "main(['verify', 'gs://b/x.rp'])\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "RESTOREPOINT_DEBUG"}
    if debug:
        env["RESTOREPOINT_DEBUG"] = "1"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env
    )
    assert proc.returncode == 4
    if debug:
        assert "Traceback" in proc.stderr and "out of retries" in proc.stderr
    else:
        assert one_error_line(proc) == (
            "restorepoint: error: gs://b/x.rp: storage unreachable or failing"
        )
