"""`speclite chat`: the interactive session (session.py) and its Rich view (view.py)."""
