"""Ed25519 signatures on artifacts: who wrote this file, checked before anything in it is used.

An artifact's SHA-256 digests catch corruption, not tampering: whoever can edit the file can
recompute them.  A signature can only be made with the private key, so an artifact signed by
a key you trust was written by its holder, byte for byte.  A signed artifact carries a
trailer after its digest::

    signature    Ed25519 over SIGNED_PREFIX + the artifact's SHA-256 digest   (64 bytes)
    public key   the signer's raw Ed25519 public key                          (32 bytes)
    magic        SIGNATURE_MAGIC                                              (8 bytes)

NOTE: the signer's key inside the file only says *which* key signed; trust comes from the
keys the loader is given (``trusted_keys=`` or ``$CODEGRAFT_TRUSTED_KEYS``), never from the
file.  Keys are PEM files (PKCS#8 private, SubjectPublicKeyInfo public), as
``codegraft keygen`` writes them.  Needs the ``cryptography`` package (``codegraft[sign]``).

Example::

    private_pem, public_pem = generate_key()
    signed = sign_artifact(artifact, private_pem)
    unsigned = verify_artifact(signed, trusted=load_public_keys([public_pem]), where="model.cgx")
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from codegraft.errors import CodegraftError, SignatureError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

SIGNATURE_MAGIC = b"CGXSIG\x00\x01"
SIGNED_PREFIX = b"codegraft artifact signature v1\x00"
TRUSTED_KEYS_ENV = "CODEGRAFT_TRUSTED_KEYS"
_SIGNATURE_SIZE, _KEY_SIZE, _DIGEST_SIZE = 64, 32, 32
_TRAILER_SIZE = _SIGNATURE_SIZE + _KEY_SIZE + len(SIGNATURE_MAGIC)

KeySource = str | os.PathLike[str] | bytes | Any  # a PEM file, PEM bytes, or a cryptography key object


@dataclass(frozen=True)
class Signature:
    """The trailer of a signed artifact: the signer's raw public key and the signature."""

    public_key: bytes
    signature: bytes

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.public_key)


def fingerprint(raw_public_key: bytes) -> str:
    """A short name for a public key: the first 16 hex digits of its SHA-256."""
    return hashlib.sha256(raw_public_key).hexdigest()[:16]


def _crypto() -> Any:
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        raise CodegraftError(
            "signing and verifying artifacts needs the 'cryptography' package: pip install 'codegraft[sign]'"
        ) from None
    return serialization, ed25519


def generate_key() -> tuple[bytes, bytes]:
    """A new Ed25519 key pair as PEM: (private, public)."""
    serialization, ed25519 = _crypto()
    key = ed25519.Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return private, public


def _pem(source: KeySource, what: str) -> tuple[bytes, str]:
    if isinstance(source, bytes):
        return source, f"the given {what}"
    try:
        path = os.fspath(source)
    except TypeError:
        kind = type(source).__name__
        raise SignatureError(f"a {what} is a PEM file, PEM bytes or a key object, not {kind}") from None
    try:
        with open(path, "rb") as handle:
            return handle.read(), path
    except OSError as error:
        raise SignatureError(f"cannot read {what} {path}: {error.strerror or error}") from None


def load_private_key(source: KeySource) -> Ed25519PrivateKey:
    """An Ed25519 private key from a PEM file or bytes (or the key object itself)."""
    serialization, ed25519 = _crypto()
    if isinstance(source, ed25519.Ed25519PrivateKey):
        return source
    data, where = _pem(source, "private key")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as error:
        raise SignatureError(f"{where} is not an unencrypted PEM private key: {' '.join(str(error).split())}") from None
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise SignatureError(f"{where} is a {type(key).__name__}, not an Ed25519 key")
    return key


def load_public_keys(sources: Sequence[KeySource]) -> list[Ed25519PublicKey]:
    """Ed25519 public keys from PEM files or bytes (or the key objects themselves)."""
    serialization, ed25519 = _crypto()
    keys = []
    for source in sources:
        if isinstance(source, ed25519.Ed25519PublicKey):
            keys.append(source)
            continue
        data, where = _pem(source, "public key")
        try:
            key = serialization.load_pem_public_key(data)
        except (ValueError, TypeError) as error:
            raise SignatureError(f"{where} is not a PEM public key: {' '.join(str(error).split())}") from None
        if not isinstance(key, ed25519.Ed25519PublicKey):
            raise SignatureError(f"{where} is a {type(key).__name__}, not an Ed25519 key")
        keys.append(key)
    return keys


def trusted_keys_from_env() -> list[Ed25519PublicKey]:
    """The keys listed in ``$CODEGRAFT_TRUSTED_KEYS`` (PEM files, separated by ``os.pathsep``)."""
    value = os.environ.get(TRUSTED_KEYS_ENV, "")
    paths = [p for p in value.split(os.pathsep) if p.strip()]
    return load_public_keys(paths) if paths else []


def raw_public_key(key: Ed25519PublicKey) -> bytes:
    serialization, _ = _crypto()
    return bytes(key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw))


def split_signature(data: bytes) -> tuple[bytes, Signature | None]:
    """The artifact without its signature trailer, and the trailer (``None`` when unsigned)."""
    if len(data) < _TRAILER_SIZE or not data.endswith(SIGNATURE_MAGIC):
        return data, None
    start = len(data) - _TRAILER_SIZE
    signature = bytes(data[start : start + _SIGNATURE_SIZE])
    public_key = bytes(data[start + _SIGNATURE_SIZE : start + _SIGNATURE_SIZE + _KEY_SIZE])
    return data[:start], Signature(public_key, signature)


def sign_artifact(data: bytes, key: KeySource) -> bytes:
    """``data`` (an artifact, signed or not) signed by ``key``; any earlier signature is replaced."""
    unsigned, _ = split_signature(data)
    private = load_private_key(key)
    signature = private.sign(SIGNED_PREFIX + unsigned[-_DIGEST_SIZE:])
    return unsigned + signature + raw_public_key(private.public_key()) + SIGNATURE_MAGIC


def verify_artifact(data: bytes, *, trusted: Sequence[Ed25519PublicKey], where: str) -> tuple[bytes, Signature]:
    """The unsigned artifact, once its signature verifies with one of the ``trusted`` keys.

    Raises :class:`SignatureError` for an unsigned artifact, one signed by another key, or a
    signature that does not match the file (anything in it changed after signing).
    """
    from cryptography.exceptions import InvalidSignature

    unsigned, signature = split_signature(data)
    names = ", ".join(fingerprint(raw_public_key(k)) for k in trusted)
    if signature is None:
        raise SignatureError(f"{where} is not signed; refusing it (trusted keys: {names})")
    key = next((k for k in trusted if raw_public_key(k) == signature.public_key), None)
    if key is None:
        raise SignatureError(
            f"{where} is signed by key {signature.fingerprint}, which is not trusted (trusted keys: {names})"
        )
    body, digest = unsigned[:-_DIGEST_SIZE], unsigned[-_DIGEST_SIZE:]
    try:
        if len(unsigned) < _DIGEST_SIZE or hashlib.sha256(body).digest() != digest:
            raise InvalidSignature()
        key.verify(signature.signature, SIGNED_PREFIX + digest)
    except InvalidSignature:
        raise SignatureError(
            f"{where}: the signature by key {signature.fingerprint} does not match the file; it was changed "
            "after signing"
        ) from None
    return unsigned, signature
