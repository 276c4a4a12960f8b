"""The test suite: a package, so that tests import their helpers relatively (``from .reference
import ...``) with no sys.path edit, and the library as a user does (``import cso``)."""
