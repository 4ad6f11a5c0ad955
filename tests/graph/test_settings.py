"""A node's settings have one place each and one precedence: recipe section < node argument < --set nodes.NAME."""

from __future__ import annotations

import pytest

from areal.errors import ConfigError
from areal.graph.recipe import load_recipe

RECIPE = """\
from areal import Graph, RunConfig
from areal.nodes import compute_logprob, generate, ppo_update, reward

class Tasks:
    fields = ("prompt",)
    def __iter__(self):
        return iter([{"prompt": "a"}])

def score(completion):
    return [0.0 for _ in completion]
score.input_names = ("completion",)

config = RunConfig(group_size=8, trainer={"objective": "decoupled", "lr": 1e-3})
g = Graph("settings")
g.source("tasks", Tasks())
g.add(generate("rollout", group_size=4, max_new_tokens=12))
g.add(reward("score", score))
g.add(compute_logprob("proximal"))
g.add(ppo_update("actor", objective=OBJECTIVE, lr=3e-5))
"""
ACTOR_LINE = 19


def load(write_recipe, *overrides: str, objective: str = '"standard"'):
    # ppo_update reads `advantage`: a stand-in producer keeps the graph valid
    text = RECIPE.replace("OBJECTIVE", objective).replace(
        'g.add(reward("score", score))',
        'g.add(reward("score", score))\nfrom tests.graph.test_settings import advantage\ng.add(advantage)',
    )
    return load_recipe(write_recipe(text), list(overrides))


def test_a_trainer_argument_wins_over_the_recipe_section_for_that_node_only(write_recipe):
    recipe = load(write_recipe)
    actor = recipe.node_config("actor").trainer
    assert (actor.objective, actor.lr) == ("standard", 3e-5)
    assert (recipe.config.trainer.objective, recipe.config.trainer.lr) == ("decoupled", 1e-3)


def test_set_nodes_name_field_wins_over_the_node_argument(write_recipe):
    recipe = load(write_recipe, "nodes.actor.objective=decoupled-shortcut", "nodes.actor.lr=1e-6")
    actor = recipe.node_config("actor").trainer
    assert (actor.objective, actor.lr) == ("decoupled-shortcut", 1e-6)


def test_setting_the_section_field_a_node_sets_is_refused_naming_the_node_and_the_way(write_recipe):
    with pytest.raises(ConfigError) as caught:
        load(write_recipe, "trainer.objective=decoupled", "steps=3")
    assert str(caught.value) == (
        f"trainer.objective=decoupled: x.py:{ACTOR_LINE + 2}: node 'actor' (ppo-update) sets objective='standard' "
        "itself, which wins over trainer.objective; change it there, or use --set nodes.actor.objective=..."
    )
    load(write_recipe, "trainer.clip_eps=0.1")  # a field the node leaves alone stays the section's to set


def test_an_unknown_objective_is_refused_at_the_recipe_line(write_recipe):
    with pytest.raises(ConfigError, match=rf"x\.py:{ACTOR_LINE + 2}: ppo_update\('actor'\): objective: input should be "
                       r"'decoupled', 'standard' or 'decoupled-shortcut'"):
        load(write_recipe, objective='"ppo2"')
    with pytest.raises(ConfigError,
                       match=r"node 'actor' \(ppo-update\): trainer\.objective: input should be 'decoupled'"):
        load(write_recipe, "nodes.actor.objective=ppo2")


def test_unknown_settings_and_nodes_are_named(write_recipe):
    with pytest.raises(ConfigError, match=r"node 'actor' \(ppo-update\): unknown setting 'lrr' \(it takes: lr, "):
        load(write_recipe, "nodes.actor.lrr=1")
    with pytest.raises(ConfigError, match=r"there is no node 'critic' \(nodes: tasks, rollout, score, advantage, "):
        load(write_recipe, "nodes.critic.lr=1")


def test_a_generators_group_size_and_sampling_bind_the_whole_run(write_recipe):
    recipe = load(write_recipe)
    assert (recipe.config.group_size, recipe.config.generation.max_new_tokens) == (4, 12)
    assert recipe.node_config("actor").group_size == 4  # the trainer and the accounting agree with it
    assert load(write_recipe, "nodes.rollout.group_size=2").config.group_size == 2
    with pytest.raises(ConfigError, match=r"^group_size=3: .*node 'rollout' \(generate\) sets group_size=4 itself"):
        load(write_recipe, "group_size=3")
    with pytest.raises(ConfigError, match=r"generate\('rollout'\): group_size: input should be greater than 0"):
        load_recipe(write_recipe(RECIPE.replace("group_size=4", "group_size=0").replace("OBJECTIVE", '"standard"')))


def test_rules_across_fields_are_checked_on_the_nodes_whole_config(write_recipe):
    with pytest.raises(ConfigError,
                       match=r"node 'actor' \(ppo-update\): trainer: ranks=2 .* needs engine=fsdp"):
        load(write_recipe, "nodes.actor.ranks=2")


def test_a_rule_across_fields_is_said_as_its_own_message(write_recipe):
    with pytest.raises(ConfigError, match=r"^staleness_policy=drop needs mode=async \(a sync run"):
        load(write_recipe, "staleness_policy=drop", "mode=sync")


def test_more_minibatches_than_a_step_has_samples_is_refused_for_the_run_and_for_a_node(write_recipe):
    # B = 16 groups of the generator's 4: 64 samples a step, so 64 minibatches of one sample at most
    assert load(write_recipe, "trainer.minibatches=64").node_config("actor").trainer.minibatches == 64
    with pytest.raises(ConfigError, match=r"^x.py:\d+: node 'rollout' \(generate\) sets generation.max_new_tokens=12, "
                                          r"group_size=4: trainer.minibatches=65 is more than the 64 samples a step "
                                          r"trains \(batch_size=16 × group_size=4\).*at most 64"):
        load(write_recipe, "trainer.minibatches=65")
    with pytest.raises(ConfigError, match=r"node 'actor' \(ppo-update\): .*trainer.minibatches=100 is more than"):
        load(write_recipe, "nodes.actor.minibatches=100")


def test_a_microbatch_budget_that_cannot_hold_a_whole_completion_is_refused_before_the_run(write_recipe):
    # the generator's completions reach 12 tokens: a budget of 12 cannot hold one with its prompt, and the trainer
    # would stop at the first completion that long
    assert load(write_recipe, "trainer.microbatch_tokens=13").node_config("actor").trainer.microbatch_tokens == 13
    with pytest.raises(ConfigError, match=r"^x.py:\d+: node 'actor' \(ppo-update\): trainer.microbatch_tokens=12 "
                                          r"cannot hold a sample of generation.max_new_tokens=12 tokens and its "
                                          r"prompt.*at least the longest prompt \+ 12"):
        load(write_recipe, "trainer.microbatch_tokens=12")
    with pytest.raises(ConfigError, match=r"node 'actor' \(ppo-update\): .*trainer.microbatch_tokens=8 cannot hold"):
        load(write_recipe, "nodes.actor.microbatch_tokens=8")


from areal import Float, Int, node  # noqa: E402  (the stand-in advantage the recipe imports)


@node(inputs={"group_id": Int["S"]}, outputs={"advantage": Float["S"]})
def advantage(batch):
    return {}


def test_lora_is_a_trainer_setting_by_argument_or_set_and_a_field_of_a_section_the_node_sets_is_refused(write_recipe):
    recipe = load(write_recipe, "trainer.lora.rank=8")  # the section's: every trainer that sets no lora of its own
    assert recipe.node_config("actor").trainer.lora.rank == 8
    text = RECIPE.replace("OBJECTIVE", '"standard", lora={"rank": 4, "alpha": 8}').replace(
        'g.add(reward("score", score))',
        'g.add(reward("score", score))\nfrom tests.graph.test_settings import advantage\ng.add(advantage)')
    path = write_recipe(text)
    assert load_recipe(path, []).node_config("actor").trainer.lora.alpha == 8
    assert load_recipe(path, ["nodes.actor.lora.rank=16"]).node_config("actor").trainer.lora.rank == 16
    with pytest.raises(ConfigError, match=r"trainer\.lora\.rank=2: x\.py:\d+: node 'actor' \(ppo-update\) sets lora="
                                          r"\{'rank': 4, 'alpha': 8\} itself, which wins over trainer\.lora\.rank"):
        load_recipe(path, ["trainer.lora.rank=2"])


STOPS_RECIPE = """\
from areal import Graph, RunConfig
from areal.data import code_tasks, math_tasks
from areal.nodes import generate

class Reader:
    fields = ("prompt",)
    def __iter__(self):
        return iter([{"prompt": "a"}])
    def stop(self):
        pass

config = RunConfig(CONFIG)
g = Graph("stops")
g.source("tasks", SOURCE)
g.add(generate("rollout"GENERATE))
"""


@pytest.mark.parametrize(("source", "config", "generate", "overrides", "stops"), [
    ('code_tasks("train")', "", "", [], ["\ndef ", "\n#", "\nprint", "\n\n"]),  # a function body ends there
    ('code_tasks("train")', "", "", ["data.path=builtin:chains"], ["\ndef ", "\n#", "\nprint", "\n\n"]),
    ('code_tasks("train")', "", "", ["data.path=mine.jsonl"], []),  # whole programs: a blank line is no end
    ('math_tasks("train")', "", "", [], []),  # "#### 42" and worked answers run to eos
    ('[{"prompt": "2 + 2 ="}]', "", "", [], []),  # a list of tasks of one's own
    ("Reader()", "", "", [], []),  # a source of one's own whose `stop` ends its reader
    ('code_tasks("train")', 'generation={"stop": ["END"]}', "", [], ["END"]),  # the recipe's own
    ('code_tasks("train")', "", ', stop=["\\n\\n"]', [], ["\n\n"]),  # the generator's own
    ('code_tasks("train")', "", "", ['generation.stop=[]'], []),  # none, by --set
])
def test_a_run_that_sets_no_stop_strings_gets_its_training_tasks_own(write_recipe, source, config, generate,
                                                                       overrides, stops):
    text = STOPS_RECIPE.replace("SOURCE", source).replace("CONFIG", config).replace("GENERATE", generate)
    recipe = load_recipe(write_recipe(text), overrides)
    settled = recipe.node_config("rollout").generation
    assert settled.stops(chat=False) == stops == recipe.config.generation.stops(chat=False)
    # a chat reply is no function body: the tasks' own do not cut it, what the run sets does
    set_by_run = config or generate or any(o.startswith("generation.stop=") for o in overrides)
    assert settled.stops(chat=True) == (stops if set_by_run else [])
