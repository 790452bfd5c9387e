"""DeepSpeed's checkpoint format, in one place (nothing here trains or saves from a live run; recipes.checkpoint.store
does, through these):

  tags            tag names (checked before they reach a path), complete.json markers, `latest`, pruning
  layout          DeepSpeed's file names inside a tag, the layout (TP x PP x DP, ZeRO) a tag was saved at
  rng             each rank's RNG states beside DeepSpeed's files
  checksums       each file's xxh3 as it was written, checked before it is read
  shards          TP shard rules of our parameter names, vocabulary padding (the canonical full state's names)
  read            any layout -> the canonical full state (weights, Adam moments, meta), one process
  relayout        a ZeRO-1/2 checkpoint -> any TP x PP x DP, tensor by tensor, without an engine
  full_state      the full state directory (safetensors + meta.json + recipe.yaml)
  engine_state    a full state -> a live engine at any layout (recipes.train.state_writer saves it)
  deepspeed_private  every DeepSpeed internal the above rely on, pinned by tests/recipes/test_deepspeed_private.py
"""
