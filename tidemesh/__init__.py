"""tidemesh: an effective-once messaging runtime.

The subpackages are the repository's top-level folders, mapped under this one import
namespace by ``package-dir`` in pyproject.toml: ``core`` (pure shared logic), ``storage``
(the SQLite and PostgreSQL write engines), ``daemon``, ``broker``, ``cli`` and ``spark``,
plus the ``schemas`` and ``migrations`` data folders.
"""

__version__ = "0.1.0"
