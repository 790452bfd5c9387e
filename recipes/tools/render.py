"""`python -m recipes render RECIPE [overrides] --out DIR`: write exactly what a run will use.

    DIR/ds_config.json   the DeepSpeed config (recipes.parallel.ds_config.build_ds_config at the recipe's layout)
    DIR/resolved.yaml    the fully resolved recipe: every `extends` merged, overrides applied, defaults filled in

The recipe is checked first as a launch would check it (`recipes.planner.validation.validate_for_launch`: the layout
and memory, a train length, the data manifests, a checkpoint directory for a run over an hour); problems exit with
code 2 and write nothing, warnings are printed to stderr. `--layout-only` checks the layout and memory alone, for a
recipe whose data or checkpoint directory is still to come.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

from recipes.parallel.ds_config import build_ds_config
from recipes.parallel.layout import Layout
from recipes.config.loading import RecipeError, load_recipe
from recipes.planner.validation import launch_refusal, validate, validate_for_launch
from recipes.config.cli_help import command_parser, refuse


EXAMPLES = (  # shown by --help
    "python -m recipes render configs/runs/llama-7b-1node-a100.yaml --layout-only --out /tmp/render"
    "   # ds_config.json + resolved.yaml",
    "python -m recipes render configs/runs/tiny-cpu.yaml parallel.tp=2 parallel.pp=2 --world-size 8 --layout-only "
    "--out /tmp/tiny",
)


def main(argv=None) -> int:
    ap = command_parser("python -m recipes render", __doc__, EXAMPLES)
    ap.add_argument("recipe", help="recipe file or preset (configs/runs/tiny-cpu.yaml)")
    ap.add_argument("overrides", nargs="*", help="dotted overrides, e.g. parallel.tp=2 training.global_batch=64")
    ap.add_argument("--out", required=True, help="directory to write ds_config.json and resolved.yaml into")
    ap.add_argument("--world-size", type=int, help="GPUs of the run (default: cluster.nodes x gpus_per_node)")
    ap.add_argument("--layout-only", action="store_true",
                    help="check the layout and memory only (not the data, train length or checkpoint directory)")
    ap.add_argument("-q", "--quiet", action="store_true", help="no warnings or summary on stderr")
    args = ap.parse_intermixed_args(argv)
    if args.world_size is not None and args.world_size <= 0:
        ap.error(f"--world-size must be positive, got {args.world_size}")
    try:
        recipe = load_recipe(args.recipe, args.overrides)
        problems = [] if args.layout_only else validate_for_launch(recipe, args.world_size)
        if problems:
            raise RecipeError(launch_refusal(recipe, problems))
        warnings = validate(recipe, args.world_size)
        layout = Layout.from_recipe(recipe, args.world_size)
        ds = build_ds_config(recipe, layout)
    except RecipeError as e:
        return refuse(e)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "ds_config.json").write_text(json.dumps(ds, indent=2) + "\n")
    resolved = recipe.model_dump(mode="json")
    resolved["parallel"]["dp"] = layout.dp  # make the derived degree explicit
    header = f"# Resolved from {args.recipe}" + (f" with {' '.join(args.overrides)}" if args.overrides else "") + "\n"
    (out / "resolved.yaml").write_text(header + f"# layout: {layout.describe()}\n"
                                       + yaml.safe_dump(resolved, sort_keys=False))
    if not args.quiet:
        for w in warnings:
            print(w, file=sys.stderr)
        print(f"wrote {out / 'ds_config.json'} and {out / 'resolved.yaml'} ({layout.describe()})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
