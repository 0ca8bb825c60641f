"""docs/json.md says every field of every report: each key a real report holds is named in its command's section
(in its code block, or in `backquotes` in its prose). The reports come from real runs here."""

from __future__ import annotations

import json
import re

import pytest
from helpers.paths import REPOSITORY

from batchtui.core.cli import main

DOCS = (REPOSITORY / "docs" / "json.md").read_text()
TINY = ["--model", "tiny", "--dtype", "float32"]


def _documented(*headings: str) -> set[str]:
    """The names the sections whose heading starts with one of `headings` give: every word of their code blocks,
    every word in backquotes in their prose."""
    names = set()
    for section in re.split(r"\n## ", DOCS)[1:]:
        if section.startswith(headings):
            parts = section.split("```")
            for block in parts[1::2]:
                names |= set(re.findall(r"\w+", block))
            for prose in parts[0::2]:
                for quoted in re.findall(r"`([^`]+)`", prose):
                    names |= set(re.findall(r"\w+", quoted))
    return names


def _keys(value, inside: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    """Every key of a report with the keys it sits under (lists walked through)."""
    found = set()
    if isinstance(value, dict):
        for key, item in value.items():
            found.add((*inside, key))
            found |= _keys(item, (*inside, key))
    elif isinstance(value, list):
        for item in value:
            found |= _keys(item, inside)
    return found


# Keys whose values are a mapping of names, not fields: the environment's variables, a config's own keys.
FREE_FORM = {"variables", "model_config", "packages", "percentiles", "abs_diff_percentiles"}


def _undocumented(report: dict, documented: set[str]) -> list[str]:
    return sorted(
        "/".join(path) for path in _keys(report) if path[-1] not in documented and not FREE_FORM & set(path[:-1])
    )


@pytest.mark.parametrize(
    ("args", "sections"),
    [
        (["check", *TINY, "a b", "cd", "--modules", "--decompose", "--reference"], ("`check`", "`environment`")),
        (["check", *TINY, "a b", "cd", "--remedy", "invariant"], ("`check`", "`environment`")),
        (["check", *TINY, "a b", "cd", "--ops"], ("`check`", "`check --ops`", "`environment`")),
        # a generation's config and steps are `check`'s, a sweep's config too
        (["generate", *TINY, "a b", "cd", "--max-new-tokens", "3"], ("`generate`", "`check`", "`environment`")),
        (
            ["sweep", *TINY, "a b", "--dtypes", "float32", "--batch-sizes", "1,2"],
            ("`sweep`", "`check`", "`environment`"),
        ),
        (["probe", "--dtypes", "float32"], ("`sweep`", "`environment`")),
        (
            ["generate", *TINY, "a b", "cd", "--max-new-tokens", "3", "--vs-prefill", "--vs-trainer", "--ops"],
            ("`generate`", "`check`", "`environment`"),
        ),
        (["check", *TINY, "a b", "cd", "--explain", "kernels"], ("`check`", "`check --ops`", "`environment`")),
    ],
    ids=["check", "check-remedy", "check-ops", "generate", "sweep", "probe", "generate-vs", "explain-kernels"],
)
def test_every_key_of_a_real_report_is_in_its_section(args, sections, tmp_path):
    report = tmp_path / "r.json"
    assert main([*args, "--json", str(report)]) in (0, 1)
    missing = _undocumented(json.loads(report.read_text()), _documented(*sections))
    assert not missing, f"in the report, not in docs/json.md's {sections}: {missing}"


def test_every_key_of_a_rollouts_report_is_in_its_section(tmp_path):
    rollouts = tmp_path / "in.jsonl"
    rows = [{"prompt_ids": [104, 105], "completion_ids": [106, 107], "logprobs": [-5.5, -5.0], "top1_ids": [106, 9]}]
    rollouts.write_text("".join(json.dumps(row) + "\n" for row in rows))
    report = tmp_path / "r.json"
    assert main(["rollouts", str(rollouts), "--model", "tiny", "--json", str(report), "--quiet"]) in (0, 1)
    missing = _undocumented(
        json.loads(report.read_text()), _documented("`rollouts`", "`generate`", "`check`", "`environment`")
    )
    assert not missing, missing


def test_every_key_of_an_endpoint_report_is_in_its_section(tmp_path):
    """A server in vLLM's shapes (logprobs, token ids, prompt logprobs), the local check on: every part filled."""
    from helpers.servers import MODELS, http_json, raw_socket_server

    top = '{" a":-1.0,"b":-2.0}'
    choice = (
        '{"index":0,"text":" a","finish_reason":"length","logprobs":{"tokens":[" a"],"token_logprobs":[-1.0],'
        f'"top_logprobs":[{top}],"text_offset":[0]}},"token_ids":[97],"prompt_token_ids":[116],'
        '"prompt_logprobs":[null,{"97":{"logprob":-1.0,"rank":1,"decoded_token":"a"}}]}'
    )
    body = f'{{"id":"x","object":"text_completion","created":0,"model":"m","choices":[{choice}]}}'.encode()
    report = tmp_path / "r.json"
    with raw_socket_server(lambda request: http_json(MODELS if request.startswith(b"GET") else body)) as (url, _):
        code = main(["endpoint", "--url", url, "t", "--rounds", "1", "--concurrency", "1", "--max-new-tokens", "1",
                     "--local", "tiny", "--json", str(report)])  # fmt: skip
    assert code in (0, 1)
    missing = _undocumented(
        json.loads(report.read_text()), _documented("`endpoint`", "`generate`", "`check`", "`environment`")
    )
    assert not missing, missing


def test_every_key_of_diff_and_check_from_reports_is_in_its_section(tmp_path):
    a, b, pack = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "pack"
    assert main(["check", *TINY, "a b", "--json", str(a)]) in (0, 1)
    assert main(["check", *TINY, "--batch-size", "2", "a b", "--json", str(b), "--repro", str(pack)]) in (0, 1)
    for args in (["diff", str(a), str(b)], ["check", "--from", str(pack)]):
        report = tmp_path / "r.json"
        assert main([*args, "--json", str(report)]) in (0, 1)
        missing = _undocumented(json.loads(report.read_text()), _documented("`environment`", "`check`"))
        assert not missing, (args[0], missing)
