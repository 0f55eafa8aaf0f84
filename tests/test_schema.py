"""One schema library for every user-written config (drmas_bench/schema.py): the error line, the
generated docs tables, `drmas-bench config-schema`, and that valid files parse as before."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from drmas_bench.agents.team import team_from_dict
from drmas_bench.cli import main
from drmas_bench.pricing import PriceSheet, load_prices
from drmas_bench.schema import CONFIG_SCHEMAS, config_schema, fields_table, parse, update_docs
from drmas_bench.types import UserError
from drmas_bench.workflows import get_workflow
from drmas_trainer.config.train import RECIPES_DIR, load_config

REPO = Path(__file__).resolve().parent.parent


def test_docs_tables_match_the_schemas():
    pages = {p.name: p.read_text(encoding="utf-8") for p in (REPO / "docs").glob("*.md")}
    stale = [name for name, text in pages.items() if update_docs(text) != text]
    assert not stale, f"run `python scripts/gen_config_docs.py`: stale tables in {stale}"
    embedded = "".join(pages.values())
    for name in CONFIG_SCHEMAS:  # every config has its table somewhere in docs/
        assert f"<!-- config-schema:{name} -->" in embedded


@pytest.mark.parametrize("name", list(CONFIG_SCHEMAS))
def test_every_field_is_described_and_listed(name, capsys):
    for _, schema in config_schema(name):
        rows = fields_table(schema)
        assert rows and all(desc for _, _, _, desc in rows), [r[0] for r in rows if not r[3]]
    assert main(["config-schema", name]) == 0
    out = capsys.readouterr().out
    assert all(row[0] in out for _, s in config_schema(name) for row in fields_table(s))


def test_config_schema_markdown_is_what_docs_embed(capsys):
    assert main(["config-schema", "prices", "--markdown"]) == 0
    out = capsys.readouterr().out
    assert "| `models.NAME.input_per_1m` | number | `0.0` |" in out
    assert out in (REPO / "docs" / "pricing.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("data,line", [
    # unknown keys name themselves and what is allowed, at any depth, before other problems
    ({"worker_groups": {"g": {"model": "m", "engin": "hf"}}},
     "t.yaml: worker_groups.g.engin: unknown key; allowed: api_key_env, base_url, engine, model, options, price"),
    ({"agents": {"solver": {"wg": "g", "sampling": {"temprature": 1}}}, "bogus": 1},
     "t.yaml: agents.solver.sampling.temprature: unknown key; allowed: enable_thinking, max_new_tokens, temperature, top_p"),
    ({"worker_groups": {"g": {"engine": "hf"}}}, "t.yaml: worker_groups.g.model: required but missing"),
    ({"worker_groups": {"g": {"model": "m", "engine": "tpu"}}}, "t.yaml: worker_groups.g.engine: unknown engine 'tpu'; known:"),
    # no coercion of strings to numbers in team files (what a user wrote is what is checked)
    ({"sampling": {"temperature": "0.5"}}, "t.yaml: sampling.temperature: must be a valid number, got '0.5'"),
    ({"sampling": {"temperature": float("inf")}}, "t.yaml: sampling.temperature: must be a finite number, got inf"),
    ({"protocol": {"truncate": "top"}}, "t.yaml: protocol.truncate: must be 'left', 'middle' or 'right', got 'top'"),
    ({"prompts": 3}, "t.yaml: prompts: must be a file name or a mapping"),
])
def test_team_file_errors_are_one_line_with_the_key_path(data, line):
    with pytest.raises(UserError) as e:
        team_from_dict({"worker_groups": {"g": "m"}, "agents": {"solver": "g", "checker": "g"}, **data},
                       ("solver", "checker"), "toy", where="t.yaml")
    msg = str(e.value)
    assert msg.startswith(line) and "\n" not in msg and "pydantic" not in msg and "Schema" not in msg, msg


def test_example_team_files_parse_as_before():
    for f in sorted((REPO / "examples" / "teams").glob("*.yaml")):
        d = yaml.safe_load(f.read_text())
        wf = get_workflow(d.get("workflow") or "toy")
        team = team_from_dict(d, wf.agents, wf.name, where=str(f))
        assert set(team.agents) == set(wf.agents) and set(team.agents.values()) <= set(team.worker_groups)
    team = team_from_dict({"worker_groups": {"g": "m", "h": {"model": "n", "options": None}},
                           "agents": {"solver": "g", "checker": {"wg": "h", "sampling": {"top_p": 0.5}}},
                           "sampling": {"temperature": 0}, "protocol": {"max_prompt_tokens": 0}},
                          ("solver", "checker"), "toy")
    assert team.worker_groups["g"].model == "m" and team.worker_groups["h"].options == {}
    assert team.agent_sampling == {"checker": {"top_p": 0.5}} and team.sampling == {"temperature": 0}
    assert team.protocol == {"max_prompt_tokens": 0} and team.workflow == "toy"


def test_price_sheet_example_and_unknown_top_key():
    sheet = load_prices(REPO / "leaderboards" / "prices.example.yaml")
    assert sheet.lookup("tiny-random") is not None
    with pytest.raises(UserError, match=r"^p\.yaml: models\.a: must be a mapping, got 3$"):
        PriceSheet.from_dict({"models": {"a": 3}}, source="p.yaml")


def test_recipes_load_and_round_trip():
    for f in sorted(RECIPES_DIR.glob("*.yaml")):
        cfg = load_config(f.stem)
        assert load_config(cfg.to_dict()).to_dict() == cfg.to_dict()


@pytest.mark.parametrize("overrides,check", [
    ({"agent_defaults.lr": "1e-4", "shared": "yes", "rollout.n": 4.0},
     lambda c: c.agent_defaults["lr"] == "1e-4" and c.shared is True and c.rollout.n == 4),
    ({"agents.solver.wg": 7}, lambda c: c.agents["solver"]["wg"] == 7),
])
def test_set_overrides_are_coerced_by_the_schema(overrides, check):
    from drmas_trainer.config.groups import plan_worker_groups

    cfg = load_config("tiny", overrides)
    assert check(cfg)
    plan = plan_worker_groups(cfg, ("solver", "checker"))
    assert all(isinstance(g.settings.lr, float) for g in plan.values())


@pytest.mark.parametrize("overrides,line", [
    ({"rollout.n": True}, "rollout.n: expected a number, got True"),
    ({"agent_defaults.lr": -1}, "agent_defaults.lr: must be a finite number >= 0, got -1.0"),
    ({"agents.solver.sampling": {"enable_thinking": True}}, "agents.solver.sampling.enable_thinking: unknown key"),
    ({"ray.timeout_s": 0}, "ray.timeout_s: must be greater than 0, got 0"),
])
def test_trainer_config_errors_name_the_key(overrides, line):
    with pytest.raises(UserError) as e:
        load_config("tiny", overrides)
    assert line in str(e.value) and str(e.value).startswith(str(RECIPES_DIR / "tiny.yaml")) and "\n" not in str(e.value)


def test_parse_prefix_and_unknown_config_name():
    from drmas_bench.workflows.protocol import ProtocolSchema

    with pytest.raises(UserError, match=r"^f: protocol\.max_prompt_tokens: must be greater than or equal to 0, got -1$"):
        parse(ProtocolSchema, {"max_prompt_tokens": -1}, "f", prefix="protocol")
    with pytest.raises(UserError, match="unknown config 'x'; known: team, prices, prompts, train"):
        config_schema("x")


def test_empty_recipe_section_means_its_defaults(tmp_path):
    f = tmp_path / "r.yaml"
    f.write_text("steps: 2\nray:\n  # nothing set\nagents:\n  solver:\n")
    cfg = load_config(str(f))
    assert cfg.ray.timeout_s == 60.0 and cfg.agents == {"solver": {}} and cfg.recipe == "r"
    f.write_text("steps: 2\nray: 3\n")
    with pytest.raises(UserError, match=r"r\.yaml: ray: must be a mapping, got 3$"):
        load_config(str(f))
