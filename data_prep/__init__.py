"""data_prep: tokenize corpora into Megatron .bin/.idx shards — parallel, resumable, lossless. CLI: python -m data_prep.

Map (a module imports only from those before it in this list):
  io          file access: reads, sizes, time stamps, atomic writes (temp + fsync + rename + dir fsync), parse_size
  settings    the tokenize run's Settings and their fingerprint; progress: the bar and the tasks' progress channel
  read/       input formats -> records with their position; the inputs cut into deterministic work units
  write/      Megatron .bin/.idx shards, reject log, stats markers + manifest, verify, merge, blend
  steps/      tokenizers, the exact fast-path encoder, training a tokenizer, the tokenize step (one unit -> shard)
  executors/  run units: local pool | Ray (one interface, base.py); Slurm arrays | hostfile (launch/prep.sh) run slices
  pipeline    the tokenize driver: plan, skip complete units, execute, write the manifest
  tools/      demo, sample corpus, stats/inspect, plan, bench, bench-executors (nothing above imports them)
  cli         python -m data_prep <command>
"""
