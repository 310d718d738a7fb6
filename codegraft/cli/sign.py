"""The signing commands of the CLI: ``keygen``, ``sign``, ``verify`` (registered by ``_cli``).

Errors are raised as codegraft errors; ``_cli`` wraps every command so each prints as one line.
"""

from __future__ import annotations

import os
import pathlib
from typing import Annotated, Optional

import typer

from codegraft.errors import ArtifactError, SignatureError

TrustedKeysOption = Annotated[
    Optional[list[pathlib.Path]],  # noqa: UP045 - typer needs Optional here
    typer.Option("--trusted-key", help="A public key (PEM) the artifact must be signed by; repeat for several "
                 "(default: the files in $CODEGRAFT_TRUSTED_KEYS)."),
]
SignOption = Annotated[
    Optional[pathlib.Path],  # noqa: UP045
    typer.Option("--sign", help="Sign the artifact with this private key (PEM, from 'codegraft keygen')."),
]


def keygen_command(
    name: Annotated[pathlib.Path, typer.Argument(help="Writes NAME.key (private, mode 600) and NAME.pub.")],
) -> None:
    """Make an Ed25519 key pair for signing artifacts."""
    from codegraft.runtime.signature import fingerprint, generate_key, load_public_keys, raw_public_key

    private_path, public_path = name.with_name(name.name + ".key"), name.with_name(name.name + ".pub")
    for path in (private_path, public_path):
        if path.exists():
            raise SignatureError(f"{path} exists; not overwriting a key")
    private, public = generate_key()
    try:
        fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(private)
        public_path.write_bytes(public)
    except OSError as error:
        raise SignatureError(f"cannot write the key pair {name}: {error.strerror or error}") from None
    key = fingerprint(raw_public_key(load_public_keys([public])[0]))
    typer.echo(f"wrote {private_path} (keep it secret) and {public_path} (give it to loaders); key {key}")


def sign_command(
    artifact: Annotated[pathlib.Path, typer.Argument(help="The artifact to sign.")],
    key: Annotated[pathlib.Path, typer.Option("--key", help="The private key (PEM).")],
    output: Annotated[
        Optional[pathlib.Path],  # noqa: UP045
        typer.Option("--output", "-o", help="Where to write the signed artifact (default: in place)."),
    ] = None,
) -> None:
    """Sign an artifact (replacing any earlier signature); its contents are checked first."""
    from codegraft.runtime.artifact import check_artifact, read_artifact_file, write_file
    from codegraft.runtime.signature import (
        fingerprint,
        load_private_key,
        raw_public_key,
        sign_artifact,
        split_signature,
    )

    data, _ = split_signature(read_artifact_file(str(artifact)))
    check_artifact(data, str(artifact))  # never vouch for a file that is not a valid artifact
    private = load_private_key(key)
    target = output or artifact
    write_file(str(target), sign_artifact(data, private))
    typer.echo(f"signed {target} with key {fingerprint(raw_public_key(private.public_key()))}")


def verify_command(
    artifact: Annotated[pathlib.Path, typer.Argument(help="The artifact to check.")],
    trusted_keys: TrustedKeysOption = None,
) -> None:
    """Check an artifact's signature against trusted keys, and its header, loading nothing."""
    from codegraft.runtime.artifact import check_artifact, read_artifact_file
    from codegraft.runtime.signature import load_public_keys, trusted_keys_from_env, verify_artifact

    keys = load_public_keys(list(trusted_keys)) if trusted_keys else trusted_keys_from_env()
    if not keys:
        raise ArtifactError("no trusted keys: give --trusted-key PUB or set CODEGRAFT_TRUSTED_KEYS")
    unsigned, signature = verify_artifact(read_artifact_file(str(artifact)), trusted=keys, where=str(artifact))
    header = check_artifact(unsigned, str(artifact))
    native = " (holds native code)" if header.get("native_code") else ""
    typer.echo(f"{artifact}: signed by trusted key {signature.fingerprint}; header valid{native}")
