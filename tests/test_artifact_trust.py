"""Artifacts from a file are data: the header is validated against a schema before use, and with
trusted keys an artifact must carry a valid signature before anything in it is loaded (issue 11).

The decisive test replaces a signed artifact's C library with one whose constructor writes a
marker file, recomputes every hash, and checks the loader refuses it with the marker unwritten
(and, as the control, that without keys the same file does run the constructor).
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import textwrap
from dataclasses import replace

import numpy as np
import pytest
from artifact_util import join, replace_blob, split
from onnx import TensorProto, helper, numpy_helper

import codegraft as cg
from codegraft.backends.c._blob import Blob
from codegraft.runtime.signature import sign_artifact

pytest.importorskip("cryptography")
needs_cc = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler")


def _model():  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        [numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def exe() -> cg.Executable:
    return cg.compile(_model(), targets=["c"])


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, pathlib.Path]:
    root = tmp_path_factory.mktemp("keys")
    paths = {}
    for name in ("release", "other"):
        private, public = cg.generate_key()
        (root / f"{name}.key").write_bytes(private)
        (root / f"{name}.pub").write_bytes(public)
        paths[name], paths[f"{name}.pub"] = root / f"{name}.key", root / f"{name}.pub"
    return paths


def _feeds() -> dict[str, np.ndarray]:
    return {"x": np.arange(8, dtype=np.float32).reshape(2, 4) - 4}


# -- the header schema ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def artifact(exe: cg.Executable, tmp_path_factory: pytest.TempPathFactory) -> bytes:
    path = tmp_path_factory.mktemp("a") / "m.cgx"
    exe.save(path)
    return path.read_bytes()


def _load(data: bytes, tmp_path: pathlib.Path, **kwargs: object) -> cg.Executable:
    path = tmp_path / "edited.cgx"
    path.write_bytes(data)
    return cg.load_executable(path, **kwargs)  # type: ignore[arg-type]


def _edited(artifact: bytes, edit) -> bytes:  # type: ignore[no-untyped-def]
    header, payload = split(artifact)
    edit(header)
    return join(header, payload)


@pytest.mark.parametrize(("edit", "message"), [
    (lambda h: h["inputs"][0].update(dtype="bogus"), r"inputs\[0\]\.dtype is not a dtype"),
    (lambda h: h["constants"].append({"name": "k", "dtype": "bogus", "shape": [], "offset": 0, "size": 0,
                                      "sha256": "0" * 64}), r"constants\[0\]\.dtype is not a dtype"),
    (lambda h: h.update(outputs=["nope"]), r"outputs\[0\] names 'nope', which nothing computes"),
    (lambda h: h.update(outputs=[]), "outputs is empty"),
    (lambda h: h.pop("steps"), "lacks 'steps'"),
    (lambda h: h["steps"][0].update(inputs=["ghost"]), r"steps\[0\]\.inputs\[0\] reads 'ghost'"),
    (lambda h: h["steps"][0]["blob"].update(offset=10**12), r"steps\[0\]\.blob points outside the file"),
    (lambda h: h["steps"][0]["blob"].update(size=-1), r"steps\[0\]\.blob points outside the file"),
    (lambda h: h["steps"][0].update(native_code=1), r"steps\[0\]\.native_code must be bool, not int"),
    (lambda h: h["steps"][0].update(precision="float8"), r"steps\[0\]\.precision is 'float8'"),
    (lambda h: h["steps"][0].update(blob=None), r"steps\[0\] has no compiled blob"),
    (lambda h: h["steps"][0].update(outputs=["y", "y"]), r"steps\[0\]\.outputs lists a name twice"),
    (lambda h: h.update(steps={}), "steps must be list, not dict"),
    (lambda h: h["inputs"][0].update(shape=[2, -4]), r"inputs\[0\]\.shape\[1\] must be a size"),
    (lambda h: h.update(report=[]), "report must be dict, not list"),
    (lambda h: h.update(threads=-2), "threads must be 0 \\(all cores\\) or more, not -2"),
    (lambda h: h.update(threads="4"), "threads must be int, not str"),
])
def test_edited_header_is_refused_by_the_schema(artifact: bytes, tmp_path: pathlib.Path, edit, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(cg.ArtifactError, match=message):
        _load(_edited(artifact, edit), tmp_path)


def test_deeply_nested_header_is_refused(artifact: bytes, tmp_path: pathlib.Path) -> None:
    _, payload = split(artifact)
    deep = b"[" * 200_000 + b"]" * 200_000
    with pytest.raises(cg.ArtifactError, match="nested too deeply|must be an object"):
        _load(join(None, payload, header_text=deep), tmp_path)


def test_report_that_does_not_fit_is_an_artifact_error(artifact: bytes, tmp_path: pathlib.Path) -> None:
    with pytest.raises(cg.ArtifactError, match="malformed artifact header"):
        _load(_edited(artifact, lambda h: h.update(report={"nodes": 3})), tmp_path)


def test_step_listing_an_extra_output_fails_at_run_naming_it(artifact: bytes, tmp_path: pathlib.Path) -> None:
    loaded = _load(_edited(artifact, lambda h: h["steps"][0]["outputs"].append("extra")), tmp_path)
    with pytest.raises(cg.BackendError, match=r"returned 1 output\(s\); the schedule lists 2"):
        loaded.run(_feeds())


def test_magic_byte_flip_says_not_an_artifact(artifact: bytes, tmp_path: pathlib.Path) -> None:
    data = bytearray(artifact)
    data[5] ^= 0x01
    with pytest.raises(cg.ArtifactError, match="is not a codegraft artifact") as caught:
        _load(bytes(data), tmp_path)
    assert "truncated" not in str(caught.value)


# -- signatures ----------------------------------------------------------------------------

def test_signed_artifact_round_trip(exe: cg.Executable, keys: dict, tmp_path: pathlib.Path) -> None:
    exe.save(tmp_path / "s.cgx", signing_key=keys["release"])
    loaded = cg.load_executable(tmp_path / "s.cgx", trusted_keys=[keys["release.pub"]])
    np.testing.assert_allclose(loaded.run(_feeds())["y"], exe.run(_feeds())["y"])
    # several trusted keys: any one of them will do; no keys: loads as before
    cg.load_executable(tmp_path / "s.cgx", trusted_keys=[keys["other.pub"], keys["release.pub"].read_bytes()])
    cg.load_executable(tmp_path / "s.cgx")


def test_unsigned_or_foreign_signed_is_refused(exe: cg.Executable, keys: dict, tmp_path: pathlib.Path) -> None:
    exe.save(tmp_path / "u.cgx")
    with pytest.raises(cg.SignatureError, match="is not signed"):
        cg.load_executable(tmp_path / "u.cgx", trusted_keys=[keys["release.pub"]])
    exe.save(tmp_path / "o.cgx", signing_key=keys["other"])
    with pytest.raises(cg.SignatureError, match="signed by key [0-9a-f]{16}, which is not trusted"):
        cg.load_executable(tmp_path / "o.cgx", trusted_keys=[keys["release.pub"]])


def test_trusted_keys_from_the_environment(exe: cg.Executable, keys: dict, tmp_path: pathlib.Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    exe.save(tmp_path / "u.cgx")
    exe.save(tmp_path / "s.cgx", signing_key=keys["release"].read_bytes())
    monkeypatch.setenv("CODEGRAFT_TRUSTED_KEYS", os.pathsep.join([str(keys["other.pub"]), str(keys["release.pub"])]))
    cg.load_executable(tmp_path / "s.cgx")
    with pytest.raises(cg.SignatureError, match="is not signed"):
        cg.load_executable(tmp_path / "u.cgx")
    monkeypatch.setenv("CODEGRAFT_TRUSTED_KEYS", str(tmp_path / "missing.pub"))
    with pytest.raises(cg.SignatureError, match="cannot read public key"):
        cg.load_executable(tmp_path / "s.cgx")


def test_a_private_key_is_not_a_public_key(exe: cg.Executable, keys: dict, tmp_path: pathlib.Path) -> None:
    exe.save(tmp_path / "s.cgx", signing_key=keys["release"])
    with pytest.raises(cg.SignatureError, match="is not a PEM public key"):
        cg.load_executable(tmp_path / "s.cgx", trusted_keys=[keys["release"]])
    with pytest.raises(cg.SignatureError, match="is not an unencrypted PEM private key"):
        exe.save(tmp_path / "t.cgx", signing_key=keys["release.pub"])


def test_any_byte_changed_after_signing_is_refused(exe: cg.Executable, keys: dict, tmp_path: pathlib.Path) -> None:
    exe.save(tmp_path / "s.cgx", signing_key=keys["release"])
    data = bytearray((tmp_path / "s.cgx").read_bytes())
    data[len(data) // 3] ^= 0x10
    with pytest.raises(cg.SignatureError, match="changed after signing"):
        _load(bytes(data), tmp_path, trusted_keys=[keys["release.pub"]])


_EVIL_C = r"""
#include <stdio.h>
__attribute__((constructor)) static void planted(void) {
  FILE* f = fopen("%s", "w");
  if (f) { fputs("native code ran\n", f); fclose(f); }
}
void cg_entry(const void* const* in, void* const* out, const void* w, void* s, int n) {}
"""

_LOAD = """
import sys, codegraft as cg
keys = sys.argv[2:] or None
try:
    cg.load_executable(sys.argv[1], trusted_keys=keys)
    print("loaded")
except cg.CodegraftError as error:
    print("refused:", error)
"""


def _evil_library(tmp_path: pathlib.Path, marker: pathlib.Path) -> bytes:
    source = tmp_path / "evil.c"
    source.write_text(_EVIL_C % marker)
    compiler = shutil.which("cc") or shutil.which("gcc")
    subprocess.run([str(compiler), "-shared", "-fPIC", str(source), "-o", str(tmp_path / "evil.so")], check=True)
    return (tmp_path / "evil.so").read_bytes()


def _load_in_subprocess(path: pathlib.Path, keys: list[pathlib.Path], cache: pathlib.Path) -> str:
    env = {**os.environ, "CODEGRAFT_CACHE_DIR": str(cache)}
    env.pop("CODEGRAFT_TRUSTED_KEYS", None)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(_LOAD), str(path), *map(str, keys)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@needs_cc
def test_tampered_signed_artifact_is_refused_before_its_native_code_runs(
    exe: cg.Executable, keys: dict, tmp_path: pathlib.Path
) -> None:
    exe.save(tmp_path / "signed.cgx", signing_key=keys["release"])
    signed = (tmp_path / "signed.cgx").read_bytes()
    header, _ = split(signed)
    index = next(i for i, s in enumerate(header["steps"]) if s["backend"] == "c")
    marker = tmp_path / "constructor-ran"
    blob = Blob.decode(exe.steps[index].blob or b"")
    evil = replace(blob, library=_evil_library(tmp_path, marker)).encode()
    tampered = replace_blob(signed, index, evil)
    signature_trailer = signed[len(signed) - 104 :]
    cases = {
        "kept signature": tampered + signature_trailer,  # every hash recomputed, the old signature kept
        "re-signed by another key": sign_artifact(tampered, keys["other"]),
        "signature stripped": tampered,
    }
    for what, data in cases.items():
        path = tmp_path / "tampered.cgx"
        path.write_bytes(data)
        result = _load_in_subprocess(path, [keys["release.pub"]], tmp_path / f"cache-{len(what)}")
        assert result.startswith("refused:"), (what, result)
        assert not marker.exists(), f"{what}: the library's constructor ran before the signature was checked"
    # The control: with no trusted keys the same file loads and the planted constructor runs
    # (hashes catch corruption, not tampering; this is what the signature is for).
    (tmp_path / "tampered.cgx").write_bytes(tampered)
    assert _load_in_subprocess(tmp_path / "tampered.cgx", [], tmp_path / "cache-control") == "loaded"
    assert marker.exists()


# -- the command line ---------------------------------------------------------------------

def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k != "CODEGRAFT_TRUSTED_KEYS"}
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "codegraft._cli", *args], capture_output=True, text=True, env=full,
                          timeout=600)


def test_cli_keygen_sign_verify_run(tmp_path: pathlib.Path) -> None:
    import onnx

    onnx.save(_model(), tmp_path / "m.onnx")
    done = _cli("keygen", str(tmp_path / "release"))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "release.key").exists() and (tmp_path / "release.pub").exists()
    assert (tmp_path / "release.key").stat().st_mode & 0o077 == 0, "the private key is readable by others"
    assert _cli("keygen", str(tmp_path / "release")).returncode != 0, "keygen overwrote a key"
    _cli("keygen", str(tmp_path / "other"))

    done = _cli("compile", str(tmp_path / "m.onnx"), "-t", "c", "-o", str(tmp_path / "m.cgx"),
                "--sign", str(tmp_path / "release.key"))
    assert done.returncode == 0, done.stderr
    done = _cli("verify", str(tmp_path / "m.cgx"), "--trusted-key", str(tmp_path / "release.pub"))
    assert done.returncode == 0 and "signed by" in done.stdout, done.stdout + done.stderr
    done = _cli("run", str(tmp_path / "m.cgx"), "--random", "--trusted-key", str(tmp_path / "release.pub"))
    assert done.returncode == 0, done.stderr

    done = _cli("verify", str(tmp_path / "m.cgx"), "--trusted-key", str(tmp_path / "other.pub"))
    assert done.returncode != 0 and "not trusted" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    env = {"CODEGRAFT_TRUSTED_KEYS": str(tmp_path / "other.pub")}
    done = _cli("run", str(tmp_path / "m.cgx"), "--random", env=env)
    assert done.returncode != 0 and "not trusted" in done.stderr and "Traceback" not in done.stderr

    done = _cli("sign", str(tmp_path / "m.cgx"), "--key", str(tmp_path / "other.key"), "-o", str(tmp_path / "o.cgx"))
    assert done.returncode == 0, done.stderr
    assert _cli("verify", str(tmp_path / "o.cgx"), "--trusted-key", str(tmp_path / "other.pub")).returncode == 0
    assert _cli("verify", str(tmp_path / "o.cgx"), "--trusted-key", str(tmp_path / "release.pub")).returncode != 0


def test_header_schema_error_from_the_cli_is_one_line(artifact: bytes, tmp_path: pathlib.Path) -> None:
    (tmp_path / "e.cgx").write_bytes(_edited(artifact, lambda h: h["inputs"][0].update(dtype="bogus")))
    done = _cli("run", str(tmp_path / "e.cgx"), "--random")
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1 and "is not a dtype" in lines[0]
