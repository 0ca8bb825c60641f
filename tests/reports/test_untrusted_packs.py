"""A repro pack or a report is a file someone else sent: it never runs code, never loads a model by itself,
and every wrong type, size or kind of file is one line and exit 2, never a hang, a crash or a memory blow-up."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from batchtui.core.cli import main

TINY = ["--model", "tiny", "--dtype", "bfloat16"]


@pytest.fixture(scope="module")
def made_pack(tmp_path_factory):
    """A pack of two texts made by `check --repro`; each test changes a copy."""
    folder = tmp_path_factory.mktemp("made") / "pack"
    assert main(["check", *TINY, "Hello there", "xyz", "--repro", str(folder)]) in (0, 1)
    return folder


@pytest.fixture
def pack(made_pack, tmp_path):
    import shutil

    return shutil.copytree(made_pack, tmp_path / "pack")


def _edit(pack, name: str, change) -> None:
    path = pack / name
    data = json.loads(path.read_text())
    path.write_text(json.dumps(change(data)))


def _remote_code_folder(tmp_path, tiny_path):
    """A model folder whose config maps to its own Python, which leaves a marker file when imported."""
    import shutil

    folder = shutil.copytree(tiny_path, tmp_path / "remote-code-model")
    marker = tmp_path / "code-ran"
    (folder / "evil.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\n"
        "from transformers import Qwen2Config, Qwen2ForCausalLM\n"
        "class EvilConfig(Qwen2Config):\n    model_type = 'evil'\n"
        "class EvilModel(Qwen2ForCausalLM):\n    config_class = EvilConfig\n"
    )
    config = json.loads((folder / "config.json").read_text())
    config |= {"model_type": "evil", "auto_map": {"AutoConfig": "evil.EvilConfig",
                                                  "AutoModelForCausalLM": "evil.EvilModel"}}  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    return folder, marker


def test_a_pack_can_neither_turn_on_remote_code_nor_load_a_folder_it_names(pack, tmp_path, tiny_path, capsys):
    folder, marker = _remote_code_folder(tmp_path, tiny_path)
    _edit(pack, "command.json", lambda c: c | {"settings": c["settings"] | {"model": str(folder),
                                                                             "trust_remote_code": True}})  # fmt: skip
    capsys.readouterr()
    assert main(["check", "--from", str(pack)]) == 2
    err = capsys.readouterr().err
    assert "is a path on this machine" in err and "--model" in err and err.count("\n") == 1
    assert not marker.exists()
    assert main(["check", "--from", str(pack), "--trust-remote-code"]) == 2  # remote code only with --model
    assert "--trust-remote-code is for a model named with --model" in capsys.readouterr().err
    assert not marker.exists()


def test_a_pack_runs_on_the_model_the_user_names_and_says_it_is_another(pack, capsys):
    _edit(pack, "command.json", lambda c: c | {"settings": c["settings"] | {"model": "/elsewhere/model"}})
    capsys.readouterr()
    assert main(["check", "--from", str(pack), "--model", "tiny"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "model: tiny, not the pack's /elsewhere/model: the logits compared are another model's"
    assert "2 of 2 texts reproduce" in out[-1]


def test_a_pack_s_remote_code_flag_is_never_read_as_permission(pack, capsys):
    from batchtui.core.reports.pack_reader import read_pack

    _edit(pack, "command.json", lambda c: c | {"settings": c["settings"] | {"trust_remote_code": True}})
    assert read_pack(str(pack)).settings.trust_remote_code is False
    assert main(["check", "--from", str(pack)]) == 0
    assert capsys.readouterr().out.startswith("model: tiny (the pack's)\n")


@pytest.mark.parametrize(
    ("name", "change", "said"),
    [
        ("texts.json", lambda t: t | {"texts": 5}, "'texts' must be a list"),
        ("texts.json", lambda t: t | {"texts": [["Hello there"], "xyz"]}, "'texts'[0] must be a string"),
        ("texts.json", lambda t: t | {"lines": [1]}, "2 texts but 1 line numbers"),
        ("texts.json", lambda t: t | {"lines": ["\x1b]0;owned\x07", 2]}, "'lines'[0] must be a whole number"),
        ("command.json", lambda c: c | {"command": "batchtui check"}, "'command' must be a list"),
        ("command.json", lambda c: c | {"settings": c["settings"] | {"batch_size": "8"}}, "batch_size must be int"),
        ("command.json", lambda c: c | {"settings": c["settings"] | {"run": 1}}, "unknown settings 'run'"),
        ("report.json", lambda r: [r], "must be an object, not a list"),
        ("report.json", lambda r: r | {"texts": {"0": r["texts"][0]}}, "'texts' must be a list"),
        ("report.json", lambda r: r | {"config": r["config"] | {"vocab_size": "512"}}, "'vocab_size' must be"),
    ],
)
def test_a_pack_of_wrong_types_is_one_line_and_exit_2(pack, capsys, name, change, said):
    _edit(pack, name, change)
    capsys.readouterr()
    assert main(["check", "--from", str(pack)]) == 2
    err = capsys.readouterr().err
    assert said in err and err.startswith("batchtui: error: ") and err.count("\n") == 1
    assert "\x1b" not in err


def _rewrite_logits(pack, change) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(pack / "logits.safetensors"))
    save_file(change(tensors), str(pack / "logits.safetensors"))


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (lambda t: t | {"texts/0": t["single/0"].clone()}, "unexpected tensor 'texts/0'"),
        (lambda t: t | {"single/7": t["single/0"].clone()}, "unexpected tensor 'single/7'"),
        (lambda t: t | {"single/0": t["single/0"][:, :100].contiguous()}, "has shape [11, 100], not [at most 11, 512]"),
        (lambda t: t | {"single/1": t["single/0"].repeat(9, 1)}, "not [at most 3, 512]"),
        (lambda t: t | {"single/0": t["single/0"].long()}, "has dtype 'I64'"),
    ],
)
def test_a_pack_s_logits_are_checked_against_its_texts_before_they_are_read(pack, capsys, change, said):
    _rewrite_logits(pack, change)
    capsys.readouterr()
    assert main(["check", "--from", str(pack)]) == 2
    assert said in capsys.readouterr().err


def test_a_pack_s_truncated_logits_file_is_refused(pack, capsys):
    data = (pack / "logits.safetensors").read_bytes()
    (pack / "logits.safetensors").write_bytes(data[:-10])
    assert main(["check", "--from", str(pack)]) == 2
    assert "data offsets do not fit" in capsys.readouterr().err


def test_oversized_and_special_files_are_refused_without_reading_them(pack, tmp_path):
    """A FIFO would block a plain open() for ever and /dev/zero fill the memory: both are refused at once."""
    os.unlink(pack / "texts.json")
    os.mkfifo(pack / "texts.json")
    with open(pack / "report.json", "r+b") as report:
        report.truncate(300 * 2**20)  # sparse: 300 MiB that take no disk
    zero = tmp_path / "zero.json"
    os.symlink("/dev/zero", zero)
    script = (
        "import sys; from batchtui.core.cli import main; "
        f"sys.exit(main(['check', '--from', {str(pack)!r}]) * 10 + main(['diff', {str(zero)!r}, {str(zero)!r}]))"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180)
    assert done.returncode == 22, done.stderr
    lines = done.stderr.splitlines()
    assert "over the 256 MiB limit" in lines[0]
    assert "/zero.json is not a regular file" in lines[1]
    (pack / "report.json").write_bytes(b"{}")
    done = subprocess.run([sys.executable, "-c", script.replace(" + main(['diff'", " + 0 * len(['diff'")],
                          capture_output=True, text=True, timeout=180)  # fmt: skip
    assert done.returncode == 20 and "no 'config'" in done.stderr


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (lambda r: r | {"texts": "abc"}, "'texts' must be a list"),
        (lambda r: r | {"texts": [r["texts"][0] | {"max_abs_diff": "big"}]}, "'max_abs_diff' must be a number"),
        (lambda r: r | {"texts": [r["texts"][0] | {"positions": [{"index": "0"}]}]}, "'index' must be a whole"),
        (lambda r: r | {"environment": r["environment"] | {"identity": {"weights_sha256": {}}}}, "weights_sha256"),
    ],
)
def test_a_report_given_to_diff_is_checked_before_use(tmp_path, capsys, change, said):
    report = tmp_path / "a.json"
    assert main(["check", *TINY, "Hello there", "--json", str(report)]) in (0, 1)
    hostile = tmp_path / "b.json"
    hostile.write_text(json.dumps(change(json.loads(report.read_text()))))
    capsys.readouterr()
    assert main(["diff", str(report), str(hostile)]) == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1


@pytest.mark.parametrize("saved", ["[]", "5", '{"k": {}}', "{not json", "HASHES"])
def test_a_hash_cache_of_any_content_is_rebuilt_never_trusted_and_the_report_is_written(
    tmp_path, monkeypatch, capsys, tiny_path, saved
):
    import shutil

    from batchtui.core.reports.environment import file_hash

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    model = shutil.copytree(tiny_path, tmp_path / "batchtui" / "models" / tiny_path.name)  # the cache's own copy
    weights = model / "model.safetensors"
    status = weights.stat()
    key = f"{weights.resolve()}|{status.st_size}|{status.st_mtime_ns}"
    if saved == "HASHES":  # a value copied into the report's identity unless checked
        saved = json.dumps({key: "\x1b]0;owned\x07", f"{model / 'config.json'}|1|1": ["a"]})
    (tmp_path / "batchtui" / "file-hashes.json").write_text(saved)
    report = tmp_path / "r.json"
    assert main(["check", *TINY, "a", "--json", str(report)]) == 0
    identity = json.loads(report.read_text())["environment"]["identity"]
    import hashlib

    expected = hashlib.sha256(f"model.safetensors:{file_hash(weights, {})}\n".encode()).hexdigest()
    assert identity["weights_sha256"] == expected
    assert json.loads((tmp_path / "batchtui" / "file-hashes.json").read_text())[key] == file_hash(weights, {})


def test_a_cache_home_that_is_not_a_folder_is_one_notice_and_the_run_goes_on(tmp_path, monkeypatch, capsys):
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(not_a_folder))
    report = tmp_path / "r.json"
    assert main(["check", *TINY, "a", "--json", str(report)]) == 0
    err = capsys.readouterr().err
    assert err.startswith(f"batchtui: notice: cache folder {not_a_folder}/batchtui cannot be used (Not a directory)")
    assert json.loads(report.read_text())["summary"]["texts"] == 1


def test_a_pack_s_own_model_runs_only_when_built_in_or_already_in_the_hub_cache(pack, tmp_path, monkeypatch):
    from huggingface_hub import constants

    from batchtui.core.errors import InputError
    from batchtui.core.reports.pack_reader import choose_model, read_pack

    cache = tmp_path / "hub"
    snapshot = cache / "models--someone--cached" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (cache / "models--someone--cached" / "refs").mkdir()
    (cache / "models--someone--cached" / "refs" / "main").write_text("abc123")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.chdir(tmp_path)
    loaded = read_pack(str(pack))
    for model, allowed in (("tiny", True), ("someone/cached", True), ("someone/elsewhere", False), ("hub", False)):
        loaded.settings = loaded.settings.with_changes(model=model)
        if allowed:
            assert choose_model(loaded, None, False).line == f"model: {model} (the pack's)"
        else:  # not cached, or a folder here ("hub" is one, in the working folder)
            with pytest.raises(InputError, match="name the model to run it on with --model"):
                choose_model(loaded, None, False)


def test_a_number_no_float_holds_in_a_report_is_one_line_and_exit_2(tmp_path, capsys):
    """`diff` reading a report whose text's max_abs_diff is a 400-digit integer: the schema's number refuses it."""
    from batchtui.core.cli import main

    report = tmp_path / "a.json"
    assert main(["check", "--model", "tiny", "--dtype", "float32", "ab", "--json", str(report)]) in (0, 1)
    text = report.read_text()
    data = json.loads(text)
    data["texts"][0]["max_abs_diff"] = 0.5
    hostile = json.dumps(data).replace('"max_abs_diff": 0.5', '"max_abs_diff": ' + "9" * 400, 1)
    other = tmp_path / "b.json"
    other.write_text(hostile)
    capsys.readouterr()
    assert main(["diff", str(report), str(other)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'max_abs_diff' must be a number or null, not a number no float holds" in err


@pytest.mark.parametrize("name", ["texts.json", "report.json", "command.json", "logits.safetensors"])
def test_no_file_of_a_pack_is_followed_out_of_it_by_a_symlink(pack, tmp_path, capsys, name):
    """A pack's file as a symlink (to a copy of itself outside the pack, which would read fine): refused."""
    outside = tmp_path / f"outside-{name}"
    os.replace(pack / name, outside)
    os.symlink(outside, pack / name)
    capsys.readouterr()
    assert main(["check", "--from", str(pack)]) == 2
    err = capsys.readouterr().err
    assert f"{pack / name} is a symbolic link: not followed" in err and err.count("\n") == 1
