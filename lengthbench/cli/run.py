"""``lengthbench run`` (being written)."""


def register(app):
    pass
