"""Tools built on the library: demo (the main job), report, benchmarks, render, presets, measure_zero."""
