"""The HTML report of a study: page (html.py), figures (plots.py), formatting (format.py) and the
profile section (profile.py).
"""
