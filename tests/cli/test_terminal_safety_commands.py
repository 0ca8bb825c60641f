"""Every command, fed hostile strings from every outside source (a model folder's name, texts, a pack, a server's
answer, reports given to diff), writes no escape or C1 control to the terminal: stdout and stderr alike."""

from __future__ import annotations

import json
import shutil
import unicodedata

import pytest
from helpers.servers import http_json, raw_socket_server

from batchtui.core.cli import main

TEXTS = ["retitle\x1b]0;owned\x07 the terminal", "c1 \x9b31m red", "bidi \u202eevil"]
FOLDER_NAME = "model\x1b]0;owned\x07\x9b2J"


def _unsafe(text: str) -> list[str]:
    return [ch for ch in text if ch not in "\n\r" and unicodedata.category(ch) in ("Cc", "Cf")]


@pytest.fixture(scope="module")
def hostile_model(tmp_path_factory, tiny_path):
    return str(shutil.copytree(tiny_path, tmp_path_factory.mktemp("models") / FOLDER_NAME))


@pytest.mark.parametrize(
    "command",
    [
        ["check"],
        ["check", "--modules"],
        ["generate", "--max-new-tokens", "2"],
        ["sweep", "--dtypes", "float32", "--batch-sizes", "2", "--padding-sides", "left"],
        ["check", "--remedy", "invariant"],
    ],
    ids=lambda c: " ".join(c[:2]),
)
def test_local_commands_escape_a_hostile_model_name_and_texts(hostile_model, capsys, command):
    code = main([*command, "--model", hostile_model, *TEXTS])
    out, err = capsys.readouterr()
    assert code in (0, 1), err
    assert not _unsafe(out + err), (out + err)[-600:]
    assert command[0] != "check" or "model\\x1b]0;owned\\x07" in out + err  # named, escaped


def test_a_hostile_pack_and_diff_escape_everything(hostile_model, tmp_path, capsys):
    pack = tmp_path / "pack"
    assert main(["check", "--model", hostile_model, *TEXTS, "--repro", str(pack)]) in (0, 1)
    report = json.loads((pack / "report.json").read_text())
    report["environment"]["cpu"]["capability"] = "\x1b[2Jwiped\x9b"
    (pack / "report.json").write_text(json.dumps(report))
    capsys.readouterr()
    for command in (["check", "--from", str(pack), "--model", hostile_model], ["diff", str(pack), str(pack)]):
        code = main(command)
        out, err = capsys.readouterr()
        assert code in (0, 1), err
        assert not _unsafe(out + err), (out + err)[-600:]


def test_a_hostile_server_s_answers_are_escaped(capsys):
    models = json.dumps({"object": "list", "data": [{"id": "m\x1b]0;owned\x07", "object": "model"}]}).encode()
    completion = json.dumps({"id": "x", "object": "text_completion", "created": 0, "model": "m", "choices": [
        {"index": 0, "text": " \x1b[2J\x9b wiped", "finish_reason": "length", "logprobs": None}]}).encode()  # fmt: skip

    def answer(request: bytes):
        return http_json(models if request.startswith(b"GET") else completion)

    with raw_socket_server(answer) as (url, _):
        code = main(
            ["endpoint", "--url", url, "--rounds", "1", "--concurrency", "2", "--max-new-tokens", "2", *TEXTS[:2]]
        )
    out, err = capsys.readouterr()
    assert code in (0, 1), err
    assert not _unsafe(out + err), (out + err)[-600:]
    with raw_socket_server(answer) as (url, _):
        assert main(["endpoint", "--url", url, "--model", "other", "a"]) == 2  # the served names in the message
    assert not _unsafe(capsys.readouterr().err)


@pytest.mark.parametrize("control", ["\x1b]0;PWNED\x07", "\x1b[2J", "\x9b31m", "\u202e", "\x00\x7f"])
def test_names_from_a_pack_or_a_report_are_escaped_too(hostile_model, tmp_path, capsys, control):
    """Not only values: an environment's and a config's keys carrying each kind of control (OSC, CSI, C1, bidi,
    NUL and DEL), printed by `check --from` and by `diff` (its lists and its verdict line)."""
    pack = tmp_path / "pack"
    assert main(["check", "--model", hostile_model, "ab", "--repro", str(pack)]) in (0, 1)
    other = tmp_path / "other"
    shutil.copytree(pack, other)
    report = json.loads((other / "report.json").read_text())
    report["environment"][f"variables.{control}x"] = "1"
    report["config"][f"top{control}k"] = 3
    (other / "report.json").write_text(json.dumps(report))
    capsys.readouterr()
    for command in (["check", "--from", str(other), "--model", hostile_model], ["diff", str(pack), str(other)]):
        code = main(command)
        out, err = capsys.readouterr()
        assert code in (0, 1, 2), err
        assert not _unsafe(out + err), (out + err)[-600:]
