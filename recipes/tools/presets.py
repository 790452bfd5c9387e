"""`python -m recipes presets`: list the model and cluster presets under configs/ with their exact parameter counts
(total, and active per token: only the top-k routed experts of each MoE layer count).

Presets are plain YAML (configs/models/*.yaml, configs/clusters/*.yaml); a recipe names them in `extends`.
"""
from __future__ import annotations

import json
import sys

from recipes.config.loading import CONFIGS_DIR, RecipeError, deep_merge, load_raw, recipe_from_dict
from recipes.model.shape import count_parameters
from recipes.config.cli_help import command_parser, refuse


def model_presets() -> list[dict]:
    rows = []
    for path in sorted((CONFIGS_DIR / "models").glob("*.yaml")):
        name = f"models/{path.stem}"
        raw = deep_merge({"training": {"global_batch": 1}}, load_raw(path))
        m = recipe_from_dict(raw, name).model
        rows.append({"preset": name, "layers": m.num_layers, "hidden": m.hidden_size,
                     "heads": m.num_attention_heads, "groups": m.query_groups, "ffn": m.ffn_size,
                     "vocab": m.vocab_size, "seq": m.seq_length, "positions": m.position_embedding,
                     "norm": m.normalization, "mlp": m.activation, "tied": m.tied_embeddings,
                     "experts": f"{m.moe.num_experts} top-{m.moe.top_k}" if m.moe else "",
                     "parameters": count_parameters(m), "active_parameters": count_parameters(m, active=True)})
    return rows


def cluster_presets() -> list[dict]:
    rows = []
    for path in sorted((CONFIGS_DIR / "clusters").glob("*.yaml")):
        c = (load_raw(path).get("cluster") or {})
        rows.append({"preset": f"clusters/{path.stem}", **c})
    return rows


def main(argv=None) -> int:
    ap = command_parser("python -m recipes presets", __doc__)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    try:
        models, clusters = model_presets(), cluster_presets()
    except RecipeError as e:
        return refuse(e)
    if args.json:
        print(json.dumps({"models": models, "clusters": clusters}, indent=1))
        return 0
    print(f"{'model preset':<24} {'layers':>6} {'hidden':>6} {'heads':>5} {'groups':>6} {'ffn':>6} {'vocab':>6} "
          f"{'seq':>5}  {'shape':<26} {'experts':<11} {'parameters':>17} {'active':>17}")
    for r in models:
        shape = f"{r['positions']}/{r['norm']}/{r['mlp']}{'/tied' if r['tied'] else ''}"
        print(f"{r['preset']:<24} {r['layers']:>6} {r['hidden']:>6} {r['heads']:>5} {r['groups']:>6} {r['ffn']:>6} "
              f"{r['vocab']:>6} {r['seq']:>5}  {shape:<26} {r['experts']:<11} {r['parameters']:>17,} "
              f"{r['active_parameters']:>17,}")
    print(f"\n{'cluster preset':<22} {'GPU':<12} {'GPUs/node':>9} {'memory GB (GiB)':>15} {'TFLOP/s':>8} "
          f"{'NVLink GB/s':>11} {'IB GB/s/node':>12} {'failures/node-day':>17} {'ckpt GB/s/node':>14}")
    for c in clusters:
        gb = c.get("gpu_memory_gb")
        memory = f"{gb:g} ({gb * 1e9 / 2**30:.1f})" if isinstance(gb, (int, float)) else "?"
        print(f"{c['preset']:<22} {c.get('gpu', '?'):<12} {c.get('gpus_per_node', '?'):>9} "
              f"{memory:>15} {c.get('peak_tflops', '?'):>8} {c.get('intra_node_gbps', '?'):>11} "
              f"{c.get('inter_node_gbps', '?'):>12} {c.get('node_failures_per_day') or '-':>17} "
              f"{c.get('checkpoint_write_gbps_per_node') or '-':>14}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
