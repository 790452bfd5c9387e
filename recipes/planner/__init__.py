"""The planner: cost model (`cost`), its reasons (`explain`), whole-recipe validation and the checks before a launch
(`validation.validate_for_launch`, `data_checks`), the save interval (`save_interval`), the recipe a plan writes
(`write_recipe`), the `plan` CLI (`cli`)."""
