"""The JSON Schemas and test vectors, shipped as the package data of ``tidemesh.schemas``.

No code: this file only makes the folder a package, so that ``importlib.resources`` finds it
the same way in a wheel, a plain install and an editable install.
"""
