from __future__ import annotations

import pytest

from areal.config import RunConfig
from areal.errors import ConfigError, RecipeError
from areal.graph.recipe import load_recipe
from tests.graph import recipes


def test_recipe_config_and_overrides_are_applied(write_recipe):
    path = write_recipe(recipes.GOOD + "config = RunConfig(batch_size=4)\n")
    loaded = load_recipe(path, overrides=["trainer.lr=3e-6", "staleness=4"])
    assert (loaded.config.batch_size, loaded.config.trainer.lr, loaded.config.staleness) == (4, 3e-6, 4)


def test_recipe_without_config_gets_defaults(write_recipe):
    loaded = load_recipe(write_recipe(recipes.GOOD))
    # the defaults: the source's tasks' stop strings are none (they are no built-in set)
    assert loaded.config == RunConfig() and loaded.config.batch_size == 16
    assert loaded.graph.name == "ok"


def test_bad_override_names_the_field(write_recipe):
    path = write_recipe(recipes.GOOD)
    with pytest.raises(ConfigError, match=r"^--set trainer\.lr=fast: trainer\.lr: input should be a valid number"):
        load_recipe(path, overrides=["trainer.lr=fast"])
    with pytest.raises(ConfigError, match=r"trainer\.lrr: unknown field \(trainer has: lr, adam_betas, weight_decay"):
        load_recipe(path, overrides=["trainer.lrr=1"])


def test_syntax_error_names_file_and_line(write_recipe):
    path = write_recipe("from areal import Graph\ng = Graph('x'\nh = 1\n")
    with pytest.raises(RecipeError, match=r"^x\.py:2: syntax error: "):
        load_recipe(path)


def test_exception_in_recipe_names_its_line(write_recipe):
    path = write_recipe("from areal import Graph\n\ng = Graph(undefined_name)\n")
    with pytest.raises(RecipeError, match=r"^x\.py:3: NameError: name 'undefined_name' is not defined"):
        load_recipe(path)


def test_a_config_built_with_a_bad_value_or_an_unknown_field_names_each_at_the_recipe_line(write_recipe):
    head = recipes.GOOD + "from areal.config import GenerationConfig\n\n"
    line = head.count("\n") + 1
    cases = {
        "config = RunConfig(group_size='x', bach_size=4)\n": [
            "RunConfig: group_size: input should be a valid integer, unable to parse string as an integer",
            "RunConfig: bach_size: unknown field; did you mean batch_size?"],
        "config = RunConfig(generation=GenerationConfig(max_new_token=8))\n": [
            "GenerationConfig: max_new_token: unknown field; did you mean max_new_tokens?"],
        "config = RunConfig(trainer={'lora': {'zzz': 3}})\n": [
            "RunConfig: trainer.lora.zzz: unknown field (LoraConfig has: rank, alpha, dropout, target_modules)"],
    }
    for text, problems in cases.items():
        with pytest.raises(RecipeError) as raised:
            load_recipe(write_recipe(head + text))
        assert str(raised.value).splitlines() == [f"x.py:{line}: {problem}" for problem in problems]


def test_no_graph_and_two_graphs_are_clear_errors(write_recipe):
    with pytest.raises(RecipeError, match=r"exactly one Graph, found 0; add g = Graph"):
        load_recipe(write_recipe("x = 1\n"))
    two = "from areal import Graph\na = Graph('a')\nb = Graph('b')\n"
    with pytest.raises(RecipeError, match=r"exactly one Graph, found 2 \('a', 'b'\); keep one per file"):
        load_recipe(write_recipe(two, name="two.py"))


def test_two_configs_are_an_error(write_recipe):
    path = write_recipe(recipes.GOOD + "a = RunConfig()\nb = RunConfig(seed=1)\n")
    with pytest.raises(RecipeError, match="at most one RunConfig, found 2"):
        load_recipe(path)


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(RecipeError, match="no such recipe file"):
        load_recipe(tmp_path / "nope.py")


def test_recipes_are_isolated_from_each_other(write_recipe):
    first = write_recipe(recipes.GOOD + "shared_state = []\nshared_state.append(1)\n", name="a.py")
    second = write_recipe(recipes.GOOD.replace('Graph("ok")', 'Graph("other")'), name="b.py")
    assert load_recipe(first).graph.name == "ok"
    assert load_recipe(second).graph.name == "other"
    assert list(load_recipe(first).graph.nodes) == ["tasks", "gen", "score", "adv"]


def test_an_error_in_a_module_beside_the_recipe_names_its_file_and_line_and_the_import(write_recipe):
    folder = write_recipe("x = 1\n", name="probe.py").parent
    (folder / "broken_syntax_helper.py").write_text("def f(:\n    pass\n")
    (folder / "raising_helper.py").write_text("X = 1\n\nundefined_helper_name\n")
    imports_broken = write_recipe("from areal import Graph\nimport broken_syntax_helper\n", name="a.py")
    with pytest.raises(RecipeError, match=r"^broken_syntax_helper\.py:1: syntax error: .* \(imported at a\.py:2\)$"):
        load_recipe(imports_broken)
    imports_raising = write_recipe("from areal import Graph\n\nimport raising_helper\n", name="b.py")
    with pytest.raises(RecipeError, match=r"^b\.py:3: NameError: name 'undefined_helper_name' is not defined "
                                          r"\(raised at raising_helper\.py:3\)$"):
        load_recipe(imports_raising)
