"""The ``refattn`` command line: JSON that parses, names that resolve, tables that fit (issue #18)."""

from __future__ import annotations

import json

import pytest

from refattn import cli, registry


@pytest.fixture(autouse=True)
def _status_file(tmp_path, monkeypatch):
    """Keep `refattn check` from writing the user's ~/.cache status file."""
    monkeypatch.setattr(cli, "_STATUS_FILE", tmp_path / "check-status.json")


def test_check_json_prints_json_only(capsys):
    assert cli.main(["check", "softmax", "--json"]) == 0
    out, err = capsys.readouterr()
    rows = json.loads(out)  # the whole of stdout is one JSON document
    assert {r["check"] for r in rows} >= {"gradcheck", "directional"}
    assert all(r["result"] == "pass" and isinstance(r["seconds"], float) for r in rows)
    assert any(isinstance(r["max_error"], float) for r in rows)
    assert "passed, 0 failed" in err


def test_check_table_keeps_its_summary_on_stdout(capsys):
    assert cli.main(["check", "softmax"]) == 0
    out, _ = capsys.readouterr()
    assert "gradcheck" in out and "passed, 0 failed" in out


@pytest.mark.parametrize("query,slug", [("flash_attention", "online_softmax_flash_attention"),
                                        ("transolver", "transolver_physics_attention"),
                                        ("mha", "multi_head_attention"), ("fno", "fno_spectral_conv"),
                                        ("FlashAttention", "online_softmax_flash_attention"),
                                        ("gqa", "gqa_mqa"), ("sdpaa", "sdpa"), ("sdpa", "sdpa")])
def test_aliases_and_search_resolve(query, slug, capsys):
    assert registry.resolve(query).slug == slug
    assert cli.main(["show", query]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"{slug}: ")
    assert (f"{query!r} -> {slug}" in err) == (query != slug)


def test_ambiguous_or_unknown_names_exit_2(capsys):
    assert cli.main(["check", "attention"]) == 2
    assert "matches several mechanisms" in capsys.readouterr().err
    assert cli.main(["show", "xyzzy"]) == 2
    assert "no mechanism matches 'xyzzy'" in capsys.readouterr().err
    assert cli.main(["list", "xyzzy"]) == 2


def test_list_search_terms(capsys):
    assert cli.main(["list", "transolver"]) == 0
    out = capsys.readouterr().out
    slugs = [line.split()[0] for line in out.splitlines()[2:] if line.strip() and not line[0].isdigit()]
    assert slugs[0] == "transolver_physics_attention" and "geotransolver_gale" in slugs


def test_family_by_name_number_or_key(capsys):
    outs = []
    for fam in ("differential", "2-differential", "2"):
        assert cli.main(["list", "--family", fam]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1] == outs[2] and "diff_attention_v1" in outs[0] and "sdpa " not in outs[0]
    assert cli.main(["list", "--family", "bogus"]) == 2
    err = capsys.readouterr().err
    assert "family 'bogus' is unknown" in err and "2-differential" in err
    assert cli.main(["check", "--family", "bogus"]) == 2
    with pytest.raises(ValueError, match="unknown"):
        registry.all(family="bogus")
    assert registry.resolve_family("linear") == "4-linear-kernel-sparse"
    assert registry.resolve_family("operators") == "3-operator"


@pytest.mark.parametrize("width", [60, 80, 100, 140])
def test_list_fits_the_terminal(width, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", str(width))
    assert cli.main(["list"]) == 0
    table = capsys.readouterr().out.split("\n\n")[0].splitlines()
    assert max(len(line) for line in table) <= width
    assert table[0].startswith("slug") and "title" in table[0]


def test_list_shows_implemented_records_unless_all(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "200")
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    shown = [line.split()[0] for line in out.split("\n\n")[0].splitlines()[2:]]
    implemented = {r.slug for r in registry.all(implemented=True)}
    assert set(shown) == implemented
    assert "not implemented yet (--all)" in out
    assert cli.main(["list", "--all"]) == 0
    out = capsys.readouterr().out
    assert len(out.split("\n\n")[0].splitlines()[2:]) == len(registry.all()) and "impl" in out.splitlines()[0]


def test_show_prints_summary_conventions_and_upstream(capsys):
    assert cli.main(["show", "sdpa"]) == 0
    out = capsys.readouterr().out
    for part in ("Summary", "Conventions", "Upstream", "causal_alignment='top_left'", "kv_group_map='contiguous'",
                 "tensorflow/tensor2tensor", "arXiv 1706.03762", "attention_backward.cu",
                 "refattn/attention/softmax/sdpa.py", "docs/softmax-attention.md#sdpa"):
        assert part in out, part
    assert ":func:" not in out and "``" not in out
    unimplemented = registry.all(implemented=False)[0]
    assert cli.main(["show", unimplemented.slug]) == 0
    assert "not yet" in capsys.readouterr().out
