"""The command line: the typer app (app.py), shared options (options.py) and all terminal output
(render.py).
"""
