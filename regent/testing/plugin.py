"""The test kit's pytest plugin (``app.testing.plugin``: its fixtures and its hook)
under the ``regent`` name. Enable it in your top-level ``conftest.py``::

    pytest_plugins = ["regent.testing.plugin"]
"""

# pytest loads the plugins a plugin names, as it does a conftest's.
pytest_plugins = ["app.testing.plugin"]
