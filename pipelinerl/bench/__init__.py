"""Benchmarks behind ``pipelinerl bench``: engine speed and the in-flight update pause, transport
throughput, and learning speed against the conventional baseline.

Each benchmark module measures one thing and returns its headline numbers, details and notes;
``report.py`` turns them into the JSON record under ``docs/benchmarks/`` and the markdown table;
``cli.py`` holds the typer sub-app.
"""
