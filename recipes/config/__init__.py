"""The recipe: pydantic schema (`schema`) and YAML loading with `extends` and dotted overrides (`loading`)."""
