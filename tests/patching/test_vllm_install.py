"""Finding a vLLM install and its release without importing it
(sparkserve.patching.vllm_install), on synthetic package trees in tmp_path."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from sparkserve.patching.engine import PatchError
from sparkserve.patching.vllm_install import VllmInstall, locate


def make_package(parent: Path, version_py: str | None = None) -> Path:
    """PARENT/vllm/__init__.py, with _version.py holding `version_py` if given."""
    root = parent / "vllm"
    root.mkdir(parents=True)
    (root / "__init__.py").write_text("")
    if version_py is not None:
        (root / "_version.py").write_text(version_py)
    return root


def write_metadata(parent: Path, dist_info: str, metadata: str) -> None:
    (parent / dist_info).mkdir()
    (parent / dist_info / "METADATA").write_text(metadata)


@pytest.mark.parametrize("given", ["package", "parent"])
def test_root_is_the_package_directory_whichever_is_given(tmp_path: Path, given: str) -> None:
    root = make_package(tmp_path, "__version__ = version = '0.27.1'\n")
    install = locate(root if given == "package" else tmp_path)
    assert install == VllmInstall(root=root, version="0.27.1")
    assert install.file("v1/core/kv_cache_utils.py") == root / "v1" / "core" / "kv_cache_utils.py"


def test_root_is_resolved_through_links(tmp_path: Path) -> None:
    root = make_package(tmp_path / "real")
    (tmp_path / "link").symlink_to(root)
    assert locate(tmp_path / "link").root == root


def test_a_directory_without_the_package_is_a_one_line_error(tmp_path: Path) -> None:
    (tmp_path / "vllm").mkdir()  # a directory named vllm, but no __init__.py in it
    with pytest.raises(PatchError) as error:
        locate(tmp_path)
    assert str(error.value) == (
        f"--vllm-root {tmp_path}: no vllm package there "
        "(expected PATH/__init__.py or PATH/vllm/__init__.py)"
    )


@pytest.mark.parametrize(
    ("version_py", "dist_infos", "expected"),
    [
        ('version = "0.28.0"\n', {"vllm-0.27.1.dist-info": "Version: 0.27.1\n"}, "0.28.0"),
        (
            "__version__: str\nversion: str\n__version__ = version = '0.28.0'\n",
            {},
            "0.28.0",
        ),
        (
            "VERSION = (0, 28)\n",
            {"vllm-0.27.1.dist-info": "Name: vllm\nVersion: 0.27.1\n"},
            "0.27.1",
        ),
        (
            None,
            {"vllm-0.27.1.dist-info": "Metadata-Version: 2.1\nVersion:  0.27.1+cpu\n"},
            "0.27.1+cpu",
        ),
        (None, {"vllm-0.27.1.dist-info": "Name: vllm\n", "vllm-x.dist-info": "Version: 1\n"}, "1"),
        (None, {"vllm-0.27.1.dist-info": "Name: vllm\n"}, "unknown"),
        (None, {}, "unknown"),
    ],
    ids=[
        "version-py-first",
        "version-py-annotated",
        "dist-info-when-version-py-says-nothing",
        "dist-info-only",
        "first-dist-info-with-a-version",
        "dist-info-without-version",
        "nothing",
    ],
)
def test_version_from_version_py_then_dist_info(
    tmp_path: Path, version_py: str | None, dist_infos: dict[str, str], expected: str
) -> None:
    root = make_package(tmp_path, version_py)
    for dist_info, metadata in dist_infos.items():
        write_metadata(tmp_path, dist_info, metadata)
    assert locate(root).version == expected


def test_default_is_the_importable_vllm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = make_package(tmp_path, "version = '9.9.9'\n")
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert locate(None) == VllmInstall(root=root, version="9.9.9")


def test_no_importable_vllm_is_a_one_line_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    with pytest.raises(PatchError) as error:
        locate(None)
    assert str(error.value) == "no vllm package is importable here; pass --vllm-root PATH"
