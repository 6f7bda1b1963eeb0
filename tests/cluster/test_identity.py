"""The node description two nodes of a pair compare."""

from __future__ import annotations

from sparkserve.cluster.identity import FIELDS, differences, node_identity


def test_identity_names_the_image_and_the_installed_vllm() -> None:
    described = node_identity({"SPARKSERVE_IMAGE": "cpu"})
    assert set(described) == set(FIELDS)
    assert described["image"] == "cpu"
    assert node_identity({})["image"] == "host"
    assert described["vllm"] != "" and described["sparkserve"] != ""


def test_the_same_node_has_no_differences_and_each_change_is_named() -> None:
    mine = node_identity({})
    assert differences(mine, dict(mine)) == []
    peer = {**mine, "vllm": "0.1.0", "image": "cpu"}
    assert differences(mine, peer) == [
        f"image: here {mine['image']}, peer cpu",
        f"vllm: here {mine['vllm']}, peer 0.1.0",
    ]
    missing = [f"{field}: here {mine[field]}, peer missing" for field in FIELDS]
    assert differences(mine, {}) == missing
