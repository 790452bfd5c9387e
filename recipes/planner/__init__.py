"""The planner: cost model (`cost`), whole-recipe validation (`validation`), the `plan` CLI (`cli`)."""
