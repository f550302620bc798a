"""Benchmarks behind ``pipelinerl bench``: engine and transport speed (``learning`` to come).

Each benchmark module measures one thing and returns its headline numbers, details and notes;
``report.py`` turns them into the JSON record under ``docs/benchmarks/`` and the markdown table;
``cli.py`` holds the typer sub-app.
"""
