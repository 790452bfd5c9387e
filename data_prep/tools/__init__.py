"""Tools beside the library, each behind a `python -m data_prep` command: demo, sample-corpus, stats/inspect, plan,
bench, bench-executors. Nothing in the core imports them."""
